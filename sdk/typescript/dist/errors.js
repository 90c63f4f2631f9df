// Typed errors: one class per SPEC §7 problem code, plus the SDK's own.
/** Base of every error thrown by @settle/client. */
export class SettleError extends Error {
    constructor(message, options) {
        super(message, options);
        this.name = new.target.name;
    }
}
/** The request got no answer (connection refused, reset, timeout). */
export class TransportError extends SettleError {
}
/** The local ledger (`@settle/local`'s `LocalLedger`) was closed: nothing
 * was sent and no retry can succeed, so none is made (SPEC §11.11). */
export class LedgerClosed extends SettleError {
}
/** An RFC 9457 problem answer of the server. */
export class ProblemError extends SettleError {
    status;
    code;
    title;
    detail;
    field;
    correlationId;
    body;
    /** The answer's Retry-After in seconds, when it sent a number. */
    retryAfterS = null;
    constructor(status, code, body) {
        const b = (body && typeof body === 'object' ? body : {});
        super(`${status} ${code}: ${b.detail ?? b.title ?? String(body ?? '')}`);
        this.status = status;
        this.code = code;
        this.title = b.title ?? '';
        this.detail = b.detail ?? '';
        this.field = typeof b.field === 'string' ? b.field : null;
        this.correlationId = typeof b.correlation_id === 'string' ? b.correlation_id : null;
        this.body = body;
    }
}
export class BadRequest extends ProblemError {
}
export class Unauthorized extends ProblemError {
}
export class NotFound extends ProblemError {
}
export class RequestTimeout extends ProblemError {
}
export class PayloadTooLarge extends ProblemError {
}
export class InvalidRequest extends ProblemError {
}
/** A 409 protocol refusal: never retried with another key or fingerprint (SPEC §11.7). */
export class Refusal extends ProblemError {
}
export class FingerprintMismatch extends Refusal {
}
export class BindingMismatch extends Refusal {
}
export class StaleBinding extends Refusal {
}
export class StaleFence extends Refusal {
}
export class LeaseExpired extends Refusal {
}
export class WrongPurpose extends Refusal {
}
export class ResultMismatch extends Refusal {
}
export class ReceiptRequired extends Refusal {
}
export class TooManyClasses extends Refusal {
}
/** 503 `unavailable`: retryable; `retryAfterS` from Retry-After. */
export class Unavailable extends ProblemError {
}
/** 429 `rate_limited`: retried like 503 `unavailable` (honouring
 * `retryAfterS`) by the SDK's retry loops until their deadline. */
export class RateLimited extends ProblemError {
}
/** 503 `record_refused` (SPEC §6.9): an operator must look; not retried. */
export class RecordRefused extends ProblemError {
}
export const PROBLEM_CLASSES = {
    bad_request: BadRequest,
    unauthorized: Unauthorized,
    not_found: NotFound,
    request_timeout: RequestTimeout,
    payload_too_large: PayloadTooLarge,
    invalid_request: InvalidRequest,
    fingerprint_mismatch: FingerprintMismatch,
    binding_mismatch: BindingMismatch,
    stale_binding: StaleBinding,
    stale_fence: StaleFence,
    lease_expired: LeaseExpired,
    wrong_purpose: WrongPurpose,
    result_mismatch: ResultMismatch,
    receipt_required: ReceiptRequired,
    too_many_classes: TooManyClasses,
    unavailable: Unavailable,
    rate_limited: RateLimited,
    record_refused: RecordRefused,
};
const DEFAULT_CODES = { 401: 'unauthorized', 404: 'not_found', 413: 'payload_too_large', 429: 'rate_limited', 503: 'unavailable' };
/** The typed error of a problem answer. */
export function problemError(status, body, retryAfterS = null) {
    const b = body && typeof body === 'object' ? body : null;
    const code = (b && typeof b.code === 'string' && b.code) || DEFAULT_CODES[status] || `http_${status}`;
    const cls = PROBLEM_CLASSES[code] ?? (status === 409 ? Refusal : ProblemError);
    const e = new cls(status, code, body);
    e.retryAfterS = retryAfterS;
    return e;
}
/** SPEC §11.4: a `reconcile` lease was granted and no hook was given, the
 * hook answered `unavailable` (or threw), or a resend failed (SPEC §11.9);
 * the lease was handed back with reconcile(unavailable): the record stays
 * `unknown`. `cause`: the hook's or the resent effect's error, if any. */
export class ReconcileRequired extends SettleError {
    key;
    fence;
    constructor(key, fence, why = 'no reconcile hook was given', options) {
        super(`operation ${JSON.stringify(key)} needs reconciliation (fence ${fence}); ${why}. It stays unknown until ` +
            'resolved: ask the remote whether the effect happened and answer with a reconcile hook ' +
            '(reconcile on runOnce or makeIdempotent), a Reconciler, or client.reconcile(key, ...) by hand; ' +
            "'settle list --status unknown' (or client.list({ status: 'unknown' })) shows what waits", options);
        this.key = key;
        this.fence = fence;
    }
}
/** The caller's deadline passed while waiting or retrying; `cause` is the last error. */
export class DeadlineExceeded extends SettleError {
}
/** The outcome of the operation is unknown: the record is (or becomes, when
 * its lease lapses) `unknown`, reconcile required (SPEC §11.11). Thrown when
 * the effect failed after it may have reached the remote (`cause`: the
 * effect's error), when the outcome could not be recorded (`cause`: the
 * refusal or the last error; `outcome`: what could not be recorded), or when
 * a reconcile hook threw or ran past `hookTimeoutMs` (`cause`: its error, or
 * a HookTimeout). `receipt`: the `unknown` receipt, or null when none was
 * written. */
export class OutcomeUnknown extends SettleError {
    key;
    receipt;
    /** The outcome the effect produced that could not be recorded, if any. */
    outcome;
    constructor(key, receipt, cause, outcome = null) {
        const why = cause instanceof Error ? `: ${cause.message}` : '';
        super(`the outcome of operation ${JSON.stringify(key)} is unknown; it must be reconciled${why}`, { cause });
        this.key = key;
        this.receipt = receipt;
        this.outcome = outcome;
    }
}
/** A reconcile hook (of runOnce, the Reconciler or a middleware) ran past
 * its `hookTimeoutMs`: it counts as `unavailable`, and its lease is handed
 * back with reconcile(unavailable). */
export class HookTimeout extends SettleError {
    timeoutMs;
    constructor(timeoutMs) {
        super(`the reconcile hook did not answer within ${timeoutMs} ms (hookTimeoutMs)`);
        this.timeoutMs = timeoutMs;
    }
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
export class EffectNotSent extends SettleError {
}
/** SPEC §11.8: throw from an effect when the remote refused it for certain
 * (nothing was applied: a validation error, 409, 425, 429): the lease is
 * released with `not_committed` and the next run executes. */
export class EffectRefused extends SettleError {
}
/** The value an effect returned cannot be stored as JSON (a BigInt, a Map,
 * a Set, a class instance, NaN, a function, ...) and no `serializer` turned
 * it into JSON. `typeName` names the value's type, `path` (a JSON pointer)
 * where it sits in the result. Before the dispatch mark (`marksDispatch`)
 * the lease is released and this error is thrown; after it the record is
 * settled `unknown` with this message and `OutcomeUnknown` is thrown with
 * this error as its `cause`. Never silently run again. */
export class ResultNotSerializable extends SettleError {
    typeName;
    path;
    constructor(typeName, path, options) {
        super(`the effect returned ${/^[AEIOU]/.test(typeName) ? 'an' : 'a'} ${typeName}${path ? ` at ${path}` : ''}, which cannot be stored as JSON; ` +
            'register a serializer: the `serializer` option of runOnce / makeIdempotent, a function (value) => JSON value ' +
            `called for every value that is not JSON (e.g. serializer: (v) => typeof v === 'bigint' ? v.toString() : v instanceof Map ? Object.fromEntries(v) : String(v))`, options);
        this.typeName = typeName;
        this.path = path;
    }
}
