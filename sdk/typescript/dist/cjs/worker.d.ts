import type { Client } from './client.js';
import { SettleError } from './errors.js';
import type { Json, Outcome, Receipt } from './types.js';
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
export type ReconcileHook<R = unknown> = (key: string, fence: number, options: {
    signal: AbortSignal;
}) => Promise<Finding<R>> | Finding<R>;
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
declare class Deadline {
    /** Epoch ms, or null: none. */
    readonly at: number | null;
    /** `ms` from now (null: no deadline); with `absolute`, `ms` is the epoch ms itself. */
    constructor(ms: number | null, absolute?: boolean);
    left(): number;
    /** This deadline, or `ms` from now when that is later. */
    atLeast(ms: number): Deadline;
}
/** No answer, 503 `unavailable` or a 429 of settle: worth the same call again later. */
export declare function isRetryable(e: unknown): boolean;
/** Retry `fn` on no answer, 503 `unavailable` and 429 (honouring
 * Retry-After) until the deadline; then DeadlineExceeded (`cause`: the
 * last error). Anything else is thrown at once. `fn` is the same call every
 * time (SPEC §11.11: a lost call is retried with identical arguments). An
 * abort of `signal` ends the retries with its reason. */
export declare function retrying<T>(fn: () => Promise<T>, deadline: Deadline, what: string, signal?: AbortSignal): Promise<T>;
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
export declare function startHeartbeat(client: Client, key: string, fence: number, leaseMs: number, controller: AbortController, clock?: LeaseClock): Heartbeat;
/** Asks a reconcile hook, bounded by `timeoutMs` (SPEC §8, §11.10,
 * §11.11): past it, rejects with HookTimeout; an abort of `outer` rejects
 * with its reason. The hook gets a signal that is aborted in both cases. */
export declare function askHook<T>(ask: (signal: AbortSignal) => Promise<T> | T, timeoutMs: number, outer?: AbortSignal): Promise<T>;
/** The JSON form of an effect's result: plain objects, arrays, strings,
 * finite numbers, booleans and null as they are (`toJSON` honoured, an
 * undefined member left out, an undefined result null); anything else goes
 * through `serializer`, or throws ResultNotSerializable naming its type. */
export declare function encodeResult(value: unknown, serializer?: Serializer): Json;
export declare function doneToOutcome<R>(d: Done<R>, serializer?: Serializer): Outcome<R>;
/** SPEC §11: run `effect` at most once for `key`. */
export declare function runOnce<R = unknown>(client: Client, key: string, request: unknown, effect: Effect<R>, options: RunOptions<R>): Promise<RunResult<R>>;
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
export declare function makeIdempotent<A extends unknown[], R>(fn: (...args: [...A, EffectContext]) => R | Promise<R>, options: IdempotentOptions<A, R>): IdempotentFunction<A, R>;
export { Deadline, SettleError };
