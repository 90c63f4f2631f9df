// The Reconciler of SPEC §11.10: resolves records left `unknown` (reconcile
// required) by workers that died or lost their answer, with the same
// reconcile hooks runOnce takes, chosen by key prefix. It never runs an
// effect (it does not hold the requests): it only asks the hooks.
//
//   const r = new Reconciler(client, { hooks: { 'charge-': async (key, fence) => ... } });
//   await r.sweep();          // → { seen, committed, not_committed, unavailable, skipped, errors }
//   r.start(60_000);          // or every minute in the background; r.counts; await r.stop()
import type { Client } from './client.js';
import type { Logger } from './express.js';
import type { Binding, Grant } from './types.js';
import { Deadline, doneToOutcome, retrying, startHeartbeat, type Finding, type ReconcileHook, type Serializer } from './worker.js';

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
  /** A ledger call or the hook failed: the record stays as it was. */
  errors: number;
}

export interface ReconcilerOptions {
  /** Hook by key prefix (the longest matching prefix owns a key): the same hook type runOnce takes. */
  hooks: Readonly<Record<string, ReconcileHook>>;
  /** One line per record resolved (default: warnings and errors to the console). */
  logger?: Logger;
  /** The reconcile lease (default 30 000 ms), heartbeated while a hook runs. */
  leaseMs?: number;
  /** Records per listing page (default 100). */
  pageSize?: number;
  /** The claims' `worker` label (default "settle-reconciler"). */
  worker?: string;
  /** Encodes the values of a hook's result that are not JSON (as runOnce's option). */
  serializer?: Serializer;
}

type Kind = Exclude<keyof ReconcileCounts, 'seen'>;

const zero = (): ReconcileCounts => ({ seen: 0, committed: 0, not_committed: 0, unavailable: 0, skipped: 0, errors: 0 });
const defaultLogger: Logger = { info: () => {}, warn: (m) => console.warn(m), error: (m, e) => console.error(m, e ?? '') };

export class Reconciler {
  /** Totals over every sweep since construction (the metrics of the background mode). */
  readonly counts: ReconcileCounts = zero();
  /** Sweeps finished. */
  sweeps = 0;
  /** The counts of the last finished sweep. */
  lastSweep: ReconcileCounts | null = null;
  private readonly client: Client;
  private readonly hooks: Readonly<Record<string, ReconcileHook>>;
  private readonly prefixes: string[];
  private readonly log: Logger;
  private readonly leaseMs: number;
  private readonly pageSize: number;
  private readonly worker: string;
  private readonly serializer: Serializer | undefined;
  private timer: NodeJS.Timeout | null = null;
  private current: Promise<unknown> | null = null;
  private stopped = true;

  constructor(client: Client, options: ReconcilerOptions) {
    if (!client) throw new TypeError('new Reconciler(client, { hooks }) needs a settle Client');
    if (!options || !options.hooks || typeof options.hooks !== 'object') throw new TypeError('new Reconciler(client, { hooks: { [keyPrefix]: hook } })');
    for (const [p, h] of Object.entries(options.hooks)) {
      if (typeof h !== 'function') throw new TypeError(`the hook of prefix ${JSON.stringify(p)} must be a function (key, fence) => finding`);
    }
    this.client = client;
    this.hooks = options.hooks;
    this.prefixes = Object.keys(options.hooks);
    this.log = options.logger ?? defaultLogger;
    this.leaseMs = options.leaseMs ?? 30_000;
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
  async sweep(): Promise<ReconcileCounts> {
    const c = zero();
    for (const prefix of this.prefixes) {
      const hook = this.hooks[prefix] as ReconcileHook;
      let after: string | undefined;
      do {
        let page;
        try {
          page = await retrying(
            () => this.client.list({ reconcileRequired: true, keyPrefix: prefix, limit: this.pageSize, ...(after !== undefined ? { after } : {}) }),
            new Deadline(this.leaseMs),
            'list',
          );
        } catch (e) {
          c.errors++;
          this.log.error(`reconciler: listing the records of prefix ${JSON.stringify(prefix)} failed`, e);
          break;
        }
        for (const op of page.operations) {
          if (this.owner(op.key) !== prefix) continue; // a longer prefix's hook owns it
          c.seen++;
          c[await this.one(op.key, hook)]++;
        }
        after = page.next ?? undefined;
      } while (after !== undefined);
    }
    for (const k of Object.keys(c) as (keyof ReconcileCounts)[]) this.counts[k] += c[k];
    this.sweeps++;
    this.lastSweep = c;
    return c;
  }

  private async one(key: string, hook: ReconcileHook): Promise<Kind> {
    const { client, leaseMs } = this;
    const dl = () => new Deadline(leaseMs);
    let fence: number | null = null;
    try {
      const rec = await retrying(() => client.get(key), dl(), 'get');
      if (!rec.reconcileRequired) {
        this.log.info(`reconciler: ${key} skipped (resolved meanwhile)`);
        return 'skipped';
      }
      const { fingerprint, principal, scopes } = rec.reservation;
      const generation = await retrying(() => client.principal(principal), dl(), 'principal');
      const binding: Binding = { principal, scopes, generation };
      const dec = await retrying(() => client.claim(key, fingerprint, binding, { marksDispatch: true, leaseMs, worker: this.worker }), dl(), 'claim');
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
      const stop = startHeartbeat(client, key, f, leaseMs, new AbortController());
      try {
        let finding: Finding;
        try {
          finding = await hook(key, f);
        } catch (e) {
          await retrying(() => client.reconcile(key, f, 'unavailable'), dl(), 'reconcile');
          this.log.error(`reconciler: the hook failed for ${key} (fence ${f}); it stays unknown`, e);
          return 'errors';
        }
        if (typeof finding === 'object' && finding !== null) {
          let outcome;
          try {
            outcome = doneToOutcome(finding, this.serializer);
          } catch (e) {
            await retrying(() => client.reconcile(key, f, 'unavailable'), dl(), 'reconcile');
            this.log.error(`reconciler: the hook's result for ${key} cannot be stored; it stays unknown`, e);
            return 'errors';
          }
          await retrying(() => client.reconcile(key, f, 'committed', { fingerprint, binding, outcome }), dl(), 'reconcile');
          this.log.info(`reconciler: ${key} committed (fence ${f}, ${outcome.status})`);
          return 'committed';
        }
        if (finding === 'not_committed') {
          const g = (await retrying(() => client.reconcile(key, f, 'not_committed'), dl(), 'reconcile')) as Grant;
          // The execute lease it is handed never dispatched: the next claim executes.
          await retrying(() => client.release(key, g.fence, 'not_dispatched'), dl(), 'release');
          this.log.info(`reconciler: ${key} not_committed (fence ${f}); the next run executes`);
          return 'not_committed';
        }
        await retrying(() => client.reconcile(key, f, 'unavailable'), dl(), 'reconcile');
        this.log.info(`reconciler: ${key} unavailable (fence ${f}); it stays unknown`);
        return 'unavailable';
      } finally {
        stop();
      }
    } catch (e) {
      this.log.error(`reconciler: ${key}${fence === null ? '' : ` (fence ${fence})`} failed; it stays as it was`, e);
      return 'errors';
    }
  }

  /** Whether the background mode runs. */
  get running(): boolean {
    return !this.stopped;
  }

  /** Sweeps now and then every `intervalMs` after each sweep ends, until stop(). */
  start(intervalMs: number): void {
    if (!(intervalMs > 0)) throw new RangeError('start(intervalMs): intervalMs must be positive');
    if (!this.stopped) throw new Error('the reconciler is already running');
    this.stopped = false;
    const tick = () => {
      this.timer = null;
      this.current = this.sweep()
        .catch((e) => this.log.error('reconciler: sweep failed', e))
        .finally(() => {
          this.current = null;
          if (!this.stopped) this.timer = setTimeout(tick, intervalMs);
        });
    };
    tick();
  }

  /** Stops the background mode; resolves once the sweep under way (if any) ended. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    await this.current;
  }
}
