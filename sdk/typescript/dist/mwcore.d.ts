export declare const NOT_COMMITTED_STATUSES: ReadonlySet<number>;
export declare const DEFAULT_STORED_HEADERS: readonly string[];
export declare const DEFAULT_MAX_STORED_BODY: number;
/** The Idempotency-Key header is malformed or sent twice. */
export declare class KeyHeaderError extends Error {
    readonly code: 'idempotency_key_missing' | 'idempotency_key_invalid';
    constructor(code: 'idempotency_key_missing' | 'idempotency_key_invalid', message: string);
}
/** The key of the Idempotency-Key field lines: null when absent; an RFC 8941
 * sf-string ("abc") or a bare token (abc), 1–255 visible ASCII after
 * unquoting; sent twice → idempotency_key_invalid. */
export declare function parseIdempotencyKey(values: readonly string[]): string | null;
/** Each field as a 4-byte big-endian length followed by its bytes. */
export declare function frame(...fields: Uint8Array[]): Buffer;
/** SPEC §8 scope: `mw-` + hex SHA-256 of the framed namespace, principal and
 * (unquoted) header value, all UTF-8. */
export declare function ledgerKey(namespace: string, principal: string, key: string): string;
/** SPEC §8 fingerprint: SHA-256 over the framed method (upper case), the
 * request target (path with its query, as sent), the content-type ("" when
 * absent), the body bytes, then each configured header as name (lower case)
 * and value, sorted by name. With canonicalJson, a body of a JSON media
 * type that parses is replaced by its RFC 8785 form. */
export declare function requestFingerprint(method: string, target: string, contentType: string, body: Uint8Array, headers?: ReadonlyArray<readonly [string, string]>, canonicalJson?: boolean): string;
/** SHA-256 hex of the Authorization header value, or `anonymous`. */
export declare function defaultPrincipal(authorization: string | undefined | null): string;
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
/** An RFC 9457 problem+json body with the extra `code` member. */
export declare function problemBody(status: number, code: string, detail: string): Buffer;
/** Whole seconds, at least 1 (SPEC §8). */
export declare function retryAfterHeader(retryAfterMs: number): string;
