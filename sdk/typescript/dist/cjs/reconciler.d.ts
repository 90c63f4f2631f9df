import type { Client } from './client.js';
import type { Logger } from './express.js';
import { type ReconcileHook, type Serializer } from './worker.js';
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
export declare class Reconciler {
    /** Totals over every sweep since construction (the metrics of the background mode). */
    readonly counts: ReconcileCounts;
    /** Sweeps finished. */
    sweeps: number;
    /** The counts of the last finished sweep. */
    lastSweep: ReconcileCounts | null;
    private readonly client;
    private readonly hooks;
    private readonly prefixes;
    private readonly log;
    private readonly leaseMs;
    private readonly pageSize;
    private readonly worker;
    private readonly serializer;
    private timer;
    private current;
    private stopped;
    constructor(client: Client, options: ReconcilerOptions);
    /** The prefix whose hook owns `key`: the longest that matches. */
    private owner;
    /** One pass over every prefix's records that need reconciliation. Never
     * rejects: a failure is counted under `errors` and logged. */
    sweep(): Promise<ReconcileCounts>;
    private one;
    /** Whether the background mode runs. */
    get running(): boolean;
    /** Sweeps now and then every `intervalMs` after each sweep ends, until stop(). */
    start(intervalMs: number): void;
    /** Stops the background mode; resolves once the sweep under way (if any) ended. */
    stop(): Promise<void>;
}
