/** Base of every error thrown by @settle/client. */
export declare class SettleError extends Error {
    constructor(message: string, options?: {
        cause?: unknown;
    });
}
/** The request got no answer (connection refused, reset, timeout). */
export declare class TransportError extends SettleError {
}
/** The local ledger (`@settle/local`'s `LocalLedger`) was closed: nothing
 * was sent and no retry can succeed, so none is made (SPEC §11.11). */
export declare class LedgerClosed extends SettleError {
}
export interface ProblemBody {
    type?: string;
    title?: string;
    status?: number;
    detail?: string;
    code?: string;
    field?: string | null;
    correlation_id?: string;
    [k: string]: unknown;
}
/** An RFC 9457 problem answer of the server. */
export declare class ProblemError extends SettleError {
    readonly status: number;
    readonly code: string;
    readonly title: string;
    readonly detail: string;
    readonly field: string | null;
    readonly correlationId: string | null;
    readonly body: unknown;
    /** The answer's Retry-After in seconds, when it sent a number. */
    retryAfterS: number | null;
    constructor(status: number, code: string, body: unknown);
}
export declare class BadRequest extends ProblemError {
}
export declare class Unauthorized extends ProblemError {
}
export declare class NotFound extends ProblemError {
}
export declare class RequestTimeout extends ProblemError {
}
export declare class PayloadTooLarge extends ProblemError {
}
export declare class InvalidRequest extends ProblemError {
}
/** A 409 protocol refusal: never retried with another key or fingerprint (SPEC §11.7). */
export declare class Refusal extends ProblemError {
}
export declare class FingerprintMismatch extends Refusal {
}
export declare class BindingMismatch extends Refusal {
}
export declare class StaleBinding extends Refusal {
}
export declare class StaleFence extends Refusal {
}
export declare class LeaseExpired extends Refusal {
}
export declare class WrongPurpose extends Refusal {
}
export declare class ResultMismatch extends Refusal {
}
export declare class ReceiptRequired extends Refusal {
}
export declare class TooManyClasses extends Refusal {
}
/** 503 `unavailable`: retryable; `retryAfterS` from Retry-After. */
export declare class Unavailable extends ProblemError {
}
/** 429 `rate_limited`: retried like 503 `unavailable` (honouring
 * `retryAfterS`) by the SDK's retry loops until their deadline. */
export declare class RateLimited extends ProblemError {
}
/** 503 `record_refused` (SPEC §6.9): an operator must look; not retried. */
export declare class RecordRefused extends ProblemError {
}
type ProblemClass = new (status: number, code: string, body: unknown) => ProblemError;
export declare const PROBLEM_CLASSES: Readonly<Record<string, ProblemClass>>;
/** The typed error of a problem answer. */
export declare function problemError(status: number, body: unknown, retryAfterS?: number | null): ProblemError;
/** SPEC §11.4: a `reconcile` lease was granted and no hook was given, the
 * hook answered `unavailable` (or threw), or a resend failed (SPEC §11.9);
 * the lease was handed back with reconcile(unavailable): the record stays
 * `unknown`. `cause`: the hook's or the resent effect's error, if any. */
export declare class ReconcileRequired extends SettleError {
    readonly key: string;
    readonly fence: number;
    constructor(key: string, fence: number, why?: string, options?: {
        cause?: unknown;
    });
}
/** The caller's deadline passed while waiting or retrying; `cause` is the last error. */
export declare class DeadlineExceeded extends SettleError {
}
/** The outcome of the operation is unknown: the record is (or becomes, when
 * its lease lapses) `unknown`, reconcile required (SPEC §11.11). Thrown when
 * the effect failed after it may have reached the remote (`cause`: the
 * effect's error), when the outcome could not be recorded (`cause`: the
 * refusal or the last error; `outcome`: what could not be recorded), or when
 * a reconcile hook threw or ran past `hookTimeoutMs` (`cause`: its error, or
 * a HookTimeout). `receipt`: the `unknown` receipt, or null when none was
 * written. */
export declare class OutcomeUnknown extends SettleError {
    readonly key: string;
    readonly receipt: unknown;
    /** The outcome the effect produced that could not be recorded, if any. */
    readonly outcome: unknown;
    constructor(key: string, receipt: unknown, cause: unknown, outcome?: unknown);
}
/** A reconcile hook (of runOnce, the Reconciler or a middleware) ran past
 * its `hookTimeoutMs`: it counts as `unavailable`, and its lease is handed
 * back with reconcile(unavailable). */
export declare class HookTimeout extends SettleError {
    readonly timeoutMs: number;
    constructor(timeoutMs: number);
}
/** SPEC §11.8: throw from an effect (or a `makeIdempotent` function, or a
 * middleware's handler) when nothing reached the remote: the lease is
 * released (`not_dispatched` when the claim used `marksDispatch` and no
 * dispatch was marked, else `not_committed`: the caller attests that
 * nothing was applied) and the next run executes. Under `marksDispatch`,
 * any error thrown before `ctx.dispatch()` counts as this (and is thrown
 * as it is). runOnce also throws it, with the `DeadlineExceeded` of
 * `ctx.dispatch()` as its `cause`, when the dispatch mark never reached
 * settle and the lease was released `not_dispatched` (SPEC §11.11). */
export declare class EffectNotSent extends SettleError {
}
/** SPEC §11.8: throw from an effect when the remote refused it for certain
 * (nothing was applied: a validation error, 409, 425, 429): the lease is
 * released with `not_committed` and the next run executes. */
export declare class EffectRefused extends SettleError {
}
/** The value an effect returned cannot be stored as JSON (a BigInt, a Map,
 * a Set, a class instance, NaN, a function, ...) and no `serializer` turned
 * it into JSON. `typeName` names the value's type, `path` (a JSON pointer)
 * where it sits in the result. Before the dispatch mark (`marksDispatch`)
 * the lease is released and this error is thrown; after it the record is
 * settled `unknown` with this message and `OutcomeUnknown` is thrown with
 * this error as its `cause`. Never silently run again. */
export declare class ResultNotSerializable extends SettleError {
    readonly typeName: string;
    readonly path: string;
    constructor(typeName: string, path: string, options?: {
        cause?: unknown;
    });
}
export {};
