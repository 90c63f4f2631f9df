/** Base of every error thrown by @settle/client. */
export declare class SettleError extends Error {
    constructor(message: string, options?: {
        cause?: unknown;
    });
}
/** The request got no answer (connection refused, reset, timeout). */
export declare class TransportError extends SettleError {
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
/** 503 `record_refused` (SPEC §6.9): an operator must look; not retried. */
export declare class RecordRefused extends ProblemError {
}
type ProblemClass = new (status: number, code: string, body: unknown) => ProblemError;
export declare const PROBLEM_CLASSES: Readonly<Record<string, ProblemClass>>;
/** The typed error of a problem answer. */
export declare function problemError(status: number, body: unknown, retryAfterS?: number | null): ProblemError;
/** SPEC §11.4: a `reconcile` lease was granted and no hook was given (the
 * lease was handed back with reconcile(unavailable)). */
export declare class ReconcileRequired extends SettleError {
    readonly key: string;
    readonly fence: number;
    constructor(key: string, fence: number);
}
/** The caller's deadline passed while waiting or retrying; `cause` is the last error. */
export declare class DeadlineExceeded extends SettleError {
}
/** The effect threw after it may have reached the remote: settled `unknown`.
 * `cause` is the effect's error; `receipt` the unknown receipt. */
export declare class OutcomeUnknown extends SettleError {
    readonly key: string;
    readonly receipt: unknown;
    constructor(key: string, receipt: unknown, cause: unknown);
}
/** Throw from an effect when nothing reached the remote: the lease is released. */
export declare class EffectNotSent extends SettleError {
}
/** Throw from an effect when the remote definitively refused it (nothing
 * applied): the lease is released with `not_committed`. */
export declare class EffectRefused extends SettleError {
}
export {};
