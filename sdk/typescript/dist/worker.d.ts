import type { Client } from './client.js';
import { SettleError } from './errors.js';
import type { Outcome, Receipt } from './types.js';
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
declare class Deadline {
    readonly at: number | null;
    constructor(ms: number | null);
    left(): number;
}
/** Retry `fn` on 503 `unavailable` and transport errors until the deadline. */
export declare function retrying<T>(fn: () => Promise<T>, deadline: Deadline, what: string): Promise<T>;
/** Heartbeats every leaseMs/3 until stopped; aborts `controller` when the lease is lost. */
export declare function startHeartbeat(client: Client, key: string, fence: number, leaseMs: number, controller: AbortController): () => void;
export declare function doneToOutcome(d: Done): Outcome;
/** SPEC §11: run `effect` at most once for `key`. */
export declare function runOnce(client: Client, key: string, request: unknown, effect: Effect, options: RunOptions): Promise<RunResult>;
export { Deadline, SettleError };
