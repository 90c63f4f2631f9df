export declare const NOT_COMMITTED_STATUSES: ReadonlySet<number>;
export declare const DEFAULT_STORED_HEADERS: readonly string[];
export declare const DEFAULT_MAX_STORED_BODY: number;
/** The Idempotency-Key header is malformed or sent twice. */
export declare class KeyHeaderError extends Error {
    readonly code: 'idempotency_key_missing' | 'idempotency_key_invalid';
    constructor(code: 'idempotency_key_missing' | 'idempotency_key_invalid', message: string);
}
/** The key of the Idempotency-Key field lines: null when absent. After
 * trimming spaces and tabs, a value starting with `"` is an RFC 8941
 * sf-string, optionally followed by RFC 8941 parameters (parsed and
 * ignored: `"abc";a=1` is the key `abc`); any other value is the key as it
 * is (`abc;a=1` is the key `abc;a=1`). 1–255 visible ASCII after unquoting;
 * sent twice → idempotency_key_invalid. */
export declare function parseIdempotencyKey(values: readonly string[]): string | null;
/** Each field as a 4-byte big-endian length followed by its bytes. */
export declare function frame(...fields: Uint8Array[]): Buffer;
/** SPEC §8 scope: `mw-` + hex SHA-256 of the framed namespace, principal and
 * (unquoted) header value, all UTF-8. */
export declare function ledgerKey(namespace: string, principal: string, key: string): string;
/** `application/json` or any `*+json` media type (parameters and case
 * ignored; spaces and tabs around it trimmed): the bodies the fingerprint
 * reads as JSON. */
export declare function isJsonMedia(contentType: string): boolean;
/** A JSON body nested deeper than this (arrays and objects) is
 * fingerprinted as raw bytes, in every SDK. */
export declare const MAX_JSON_DEPTH = 100;
/** A middleware option refused at construction. `option` names it
 * (`canonicalJson`, `fields` or `exclude`); `code` is the shared vectors'
 * `error`: `invalid_fields`, `invalid_exclude`, `fields_and_exclude` or
 * `canonical_json_off` (and `invalid_canonical_json` for a value that is
 * not a boolean). */
export declare class MiddlewareConfigError extends TypeError {
    readonly code: string;
    readonly option: string;
    constructor(code: string, option: string, message: string);
}
/** The body options of the fingerprint as given to a middleware. */
export interface FingerprintOptionsInput {
    /** RFC 8785 form of JSON bodies (default true). */
    canonicalJson?: boolean;
    /** Only these JSON pointers of the body count. */
    fields?: readonly string[];
    /** These JSON pointers of the body do not count. */
    exclude?: readonly string[];
}
/** The body options of the fingerprint, checked (`fingerprintOptions`). */
export declare class FingerprintOptions {
    readonly canonicalJson: boolean;
    readonly fields: readonly string[] | null;
    readonly exclude: readonly string[] | null;
    /** @internal use fingerprintOptions(), which checks */
    constructor(canonicalJson: boolean, fields: readonly string[] | null, exclude: readonly string[] | null);
}
/** The body options of the fingerprint, checked (sdk/MIDDLEWARE-KEYS.md):
 * `fields` and `exclude` are non-empty arrays of RFC 6901 pointers, not
 * both; `exclude` may not hold `""` (the whole document); either needs
 * `canonicalJson`. Anything else throws MiddlewareConfigError naming the
 * option. */
export declare function fingerprintOptions(input?: FingerprintOptionsInput | FingerprintOptions): FingerprintOptions;
/** `value` without the values at `pointers` (sdk/MIDDLEWARE-KEYS.md): every
 * pointer is resolved in the document as given (before any removal; one
 * that does not resolve is ignored), then each value found is removed, an
 * object member by its name, an array element by its index (later elements
 * shift down). Removed last-first, deepest first, so the order of the
 * pointers does not matter. `value` is changed in place and returned. */
export declare function excludePointers(value: unknown, pointers: readonly string[]): unknown;
/** The body bytes that enter the fingerprint. With canonicalJson, when the
 * media type is JSON (`isJsonMedia`) and the body is not empty, is strict
 * UTF-8 (a BOM makes it not JSON), parses as JSON, nests at most
 * MAX_JSON_DEPTH deep and is accepted whole by the fingerprint helper: its
 * RFC 8785 text, after `fields` (the selection {pointer: value} of the
 * fingerprint helper) or `exclude`. Any other body: the raw bytes. */
export declare function fingerprintBody(options: FingerprintOptions, contentType: string, body: Uint8Array): Uint8Array;
/** SPEC §8 fingerprint: SHA-256 over the framed method (upper case), the
 * request target (path with its query, as sent), the content-type ("" when
 * absent), the body (`fingerprintBody`: by default the RFC 8785 form of a
 * JSON body), then each configured header as name (lower case) and value,
 * sorted by name. `options`: `fingerprintOptions(...)` (checked once), the
 * unchecked `{ canonicalJson, fields, exclude }` (checked on every call), or
 * a boolean for canonicalJson alone (default true). */
export declare function requestFingerprint(method: string, target: string, contentType: string, body: Uint8Array, headers?: ReadonlyArray<readonly [string, string]>, options?: boolean | FingerprintOptions | FingerprintOptionsInput): string;
/** The claim's binding.principal: the principal when it fits the key syntax, else `sha256:` + its digest. */
export declare function bindingPrincipal(principal: string): string;
/** The claim's `worker` field, for operators. */
export declare function workerLabel(key: string, principal: string): string;
export interface StoredResponse {
    status: number;
    headers: [string, string][];
    /** null: too large, only its digest was stored */
    body: Buffer | null;
}
export declare function responseSha256(status: number, body: Uint8Array): string;
/** The settled `result` for a response, and its response_sha256. */
export declare function encodeResponse(status: number, headers: ReadonlyArray<readonly [string, string]>, body: Uint8Array, storedNames: Iterable<string>, maxBody: number): {
    result: Record<string, unknown>;
    responseSha256: string;
};
/** A stored response, or null when `result` is not one. */
export declare function decodeResponse(result: unknown): StoredResponse | null;
export declare const PRINCIPAL_MISSING_DETAIL = "no principal was found for this request (see the principal option)";
export declare const UNAVAILABLE_DETAIL = "the idempotency ledger is unreachable; the request was not run";
export declare const FORBIDDEN_DETAIL = "the ledger refused this caller's binding (its principal was revoked or moved on)";
/** An RFC 9457 problem+json body with the extra `code` member. */
export declare function problemBody(status: number, code: string, detail: string): Buffer;
/** Whole seconds, at least 1 (SPEC §8). */
export declare function retryAfterHeader(retryAfterMs: number): string;
/** SPEC §8 (amended): the `Retry-After` of `request_in_progress` in whole
 * seconds: the time the running lease has left (ceil of lease_expires_at −
 * now), at least 1, and at least the ledger's `retry_after_ms` hint. */
export declare function inProgressRetryAfterS(retryAfterMs: number, leaseExpiresAt: string | null | undefined, now?: number): number;
/** How the middleware answers a ledger call (claim, dispatch) that failed. */
export interface LedgerFailure {
    /** A route with failOpen may run the handler: settle gave no answer, or a 503 `unavailable`. */
    failOpen: boolean;
    status: number;
    code: 'idempotency_unavailable' | 'idempotency_forbidden';
    detail: string;
    /** The Retry-After header in whole seconds; null: none (403). */
    retryAfter: number | null;
    /** An answer the middleware has no rule for (logged as an error). */
    unexpected: boolean;
}
/** SPEC §8's rule for a claim or dispatch that failed, shared by the three
 * SDKs: no answer or 503 `unavailable` → 503 `idempotency_unavailable`
 * (fail-open allowed); `stale_binding` → 403 `idempotency_forbidden`;
 * `record_refused` and any 429 → 503 (a 429's own Retry-After, rounded up,
 * when it sent one); anything else (`invalid_request`, 401, ...) → 503,
 * logged as an error. A refusal never runs the handler. */
export declare function classifyLedgerError(err: unknown, unavailableRetryAfterS: number): LedgerFailure;
