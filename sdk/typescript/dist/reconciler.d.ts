import type { Client } from './client.js';
import type { Logger } from './express.js';
import { type MiddlewareFinding } from './mwcore.js';
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
    private readonly hookTimeoutMs;
    private readonly pageSize;
    private readonly worker;
    private readonly serializer;
    private loop;
    constructor(client: Client, options: ReconcilerOptions);
    /** The prefix whose hook owns `key`: the longest that matches. */
    private owner;
    /** One pass over every prefix's records that need reconciliation. Never
     * rejects: a failure is counted under `errors` and logged. */
    sweep(): Promise<ReconcileCounts>;
    private sweepUntil;
    private one;
    /** A middleware hook's committed response, as the middleware stores one. */
    private storedResponse;
    /** Whether the background mode runs: from start() until its loop ended
     * (after stop(), once the sweep under way wound down). */
    get running(): boolean;
    /** Sweeps now and then every `intervalMs` after each sweep ends, until
     * stop(). Throws while a loop runs, also one that stop() gave up waiting
     * for and that is still winding down. */
    start(intervalMs: number): void;
    /** Stops the background mode. Resolves true once the sweep under way (if
     * any) ended, or, after `timeoutMs`, false: that sweep is then abandoned
     * (a hook still running is handed back with reconcile(unavailable) in the
     * background and counted under `errors`) and start() keeps refusing until
     * it wound down. Without a timeout, waits for the sweep to end. */
    stop(timeoutMs?: number): Promise<boolean>;
}
