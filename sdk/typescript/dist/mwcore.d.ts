import type { IncomingMessage } from 'node:http';
import type { Client } from './client.js';
import type { Receipt } from './types.js';
/** The default `releaseOn`: responses that say nothing happened (SPEC §8). */
export declare const NOT_COMMITTED_STATUSES: ReadonlySet<number>;
/** The default `ledgerDeadlineMs`: how long the calls before the handler
 * (claim, dispatch) are retried when settle does not answer. */
export declare const DEFAULT_LEDGER_DEADLINE_MS = 2000;
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
/** A value of the `worker` field (SPEC §8): every UTF-8 byte outside
 * `A-Za-z0-9-._~` as uppercase `%XX`. */
export declare function workerValue(value: string): string;
/** The claim's `worker` field (SPEC §8): `idempotency-key=<value>
 * principal=<value>`, the header value after unquoting and the principal
 * the extractor gave (not the binding's `sha256:` form), each encoded by
 * `workerValue`. Operators read it; a Reconciler parses it
 * (`parseWorkerLabel`) to hand a middleware hook the client's key and
 * principal. */
export declare function workerLabel(key: string, principal: string): string;
/** The Idempotency-Key value and the principal of a `worker` field written
 * by `workerLabel` (by any SDK's middleware), or null for another field. */
export declare function parseWorkerLabel(worker: unknown): {
    idempotencyKey: string;
    principal: string;
} | null;
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
export interface RoutePolicy {
    /** A request without a key gets 400 (else it runs unwrapped). Default true. */
    required?: boolean;
    /** Ledger unreachable (no answer, or a 503 `unavailable`): run the handler
     * without idempotency (logged) instead of 503. A refusal of the ledger
     * (`stale_binding`, `record_refused`, 429, 401, ...) never runs it. */
    failOpen?: boolean;
    /** The handler counts as failed (unknown) after this many ms. Default: none. */
    timeoutMs?: number | null;
    /** Seconds a duplicate of a request still running waits for its outcome
     * (claiming again after the ledger's retry hint) before it answers 409
     * `request_in_progress`: the outcome, if it arrives, is replayed (default
     * 0: no wait). */
    wait?: number;
    /** Statuses whose responses say nothing happened: not stored, the lease
     * released `not_committed`, the retry runs the handler (default 408, 409,
     * 425, 429). A status added to these (e.g. 422, when the framework
     * answers validation itself) is released with `forget`: the record is
     * removed, so the corrected request with the same key runs. */
    releaseOn?: readonly number[];
}
export interface Logger {
    info(msg: string): void;
    warn(msg: string): void;
    error(msg: string, err?: unknown): void;
}
/** What a principal extractor finds: the caller's account (generation 0),
 * the account with its generation, or null/undefined when the request has
 * no identity (401 `idempotency_principal_missing`). */
export type Principal = string | {
    principal: string;
    generation?: number;
} | null | undefined;
/** The `principal` option: the request → its caller. It must name the
 * caller's account, stable across credential refresh: never a token or a
 * header value (a retry sent after an OAuth refresh must replay). `Req` is
 * the framework's request: Node's IncomingMessage (Express, node:http), a
 * FastifyRequest, or a Fetch API Request. */
export type PrincipalExtractor<Req = IncomingMessage> = (req: Req) => Principal | Promise<Principal>;
/** The response a middleware reconcile hook found: what the first request's
 * handler answered (e.g. rebuilt from the upstream's record). A body that is
 * neither a string nor bytes is sent as JSON (content-type
 * application/json unless given). */
export interface ReconciledResponse {
    status: number;
    headers?: Record<string, string> | ReadonlyArray<readonly [string, string]>;
    body?: string | Uint8Array | unknown;
}
/** The stored response of a replay, as `onReplay` gets it. */
export interface ReplayedResponse {
    status: number;
    /** The stored headers, names in lower case. */
    headers: [string, string][];
    body: Buffer;
}
/** Called on every replay of a stored response (the key was answered
 * before; the handler does not run) with that response and the record's
 * receipt; what it returns (or resolves to) is sent instead, with
 * `Idempotent-Replayed: true` (a body that is neither a string nor bytes
 * is sent as JSON). What it throws goes to the framework as a handler's
 * error would; the record is not touched. */
export type ReplayResponseHook = (response: ReplayedResponse, receipt: Receipt) => ReconciledResponse | Promise<ReconciledResponse>;
/** What a middleware reconcile hook found (SPEC §8): the effect applied,
 * with the response to store and replay; not applied (the handler runs
 * under the same fence); or it cannot tell (409 `outcome_unknown`). */
export type MiddlewareFinding = 'not_committed' | 'unavailable' | {
    finding: 'committed';
    response: ReconciledResponse;
};
/** What the middleware knows of the retried request, for a reconcile hook. */
export interface ReconcileRequestInfo {
    /** The Idempotency-Key the client sent (unquoted). */
    idempotencyKey: string;
    /** The principal the extractor found (before bindingPrincipal). */
    principal: string;
    /** The request method (upper case). */
    method: string;
    /** The path with its query, as sent. */
    path: string;
    /** The request headers, names in lower case (several field lines joined with ", "). */
    headers: Record<string, string>;
    /** The request body's bytes (the stream itself is left for the handler). */
    body: Buffer;
    /** Aborted when the hook ran past `hookTimeoutMs` (its answer no longer counts). */
    signal: AbortSignal;
}
/** Asked when a retry finds the record `unknown`: the ledger key, the
 * reconcile lease's fence, the retried request (read its headers; do not
 * consume its body, the handler may still need it) and `info` (the key,
 * the principal, the method, path, headers and body's bytes). The lease is
 * heartbeated while it runs; past `hookTimeoutMs` it counts as
 * `unavailable`. */
export type MiddlewareReconcileHook<Req = IncomingMessage> = (ledgerKey: string, fence: number, req: Req, info: ReconcileRequestInfo) => Promise<MiddlewareFinding> | MiddlewareFinding;
/** The options every adapter takes (Express `idempotency`, Fastify
 * `idempotency` plugin, Fetch `withIdempotency`); `Req` is its request type. */
export interface CoreOptions<Req = IncomingMessage> {
    client: Client;
    /** Required: who the caller is (see `fixedPrincipal`, `authenticatedPrincipal`). */
    principal: PrincipalExtractor<Req>;
    /** Part of every ledger key (default "default"). */
    namespace?: string;
    /** Methods wrapped when `routes` is not given (default POST, PATCH). */
    methods?: string[];
    /** Per-route policy by method and path; null/undefined: not wrapped. */
    routes?: (method: string, path: string) => RoutePolicy | null | undefined;
    /** Headers stored and replayed besides content-type and location. */
    storedHeaders?: string[];
    /** Request headers that are part of the fingerprint. */
    fingerprintHeaders?: string[];
    /** RFC 8785 canonical JSON bodies in the fingerprint, so that key order
     * and whitespace never make a retry a mismatch (default true; false: the
     * raw bytes count). */
    canonicalJson?: boolean;
    /** Only these RFC 6901 pointers of a JSON body count in the fingerprint
     * (the object {pointer: value} of those that resolve). Not with `exclude`. */
    fields?: string[];
    /** These RFC 6901 pointers of a JSON body do not count in the
     * fingerprint (e.g. a client timestamp). Not with `fields`. */
    exclude?: string[];
    /** Responses above this are settled with their digest and not replayed (default 32 KiB). */
    maxStoredBody?: number;
    /** Request bodies above this get 413 (default 1 MiB). */
    maxRequestBody?: number;
    leaseMs?: number;
    retentionS?: number;
    timeoutMs?: number | null;
    failOpen?: boolean;
    /** Seconds a duplicate waits for the running request's outcome (RoutePolicy.wait; default 0). */
    wait?: number;
    /** Statuses released instead of stored (RoutePolicy.releaseOn; default 408, 409, 425, 429). */
    releaseOn?: readonly number[];
    /** How long a claim or dispatch that settle does not answer (no answer,
     * 503, 429) is retried, with the same claim_id, before the request gets
     * 503 `idempotency_unavailable` (default 2000 ms). */
    ledgerDeadlineMs?: number;
    /** The reconcile hook's time limit (default: leaseMs); past it, it counts as `unavailable`. */
    hookTimeoutMs?: number;
    unavailableRetryAfterS?: number;
    /** Resolves a record left unknown when a retry arrives (SPEC §8):
     * `{ finding: 'committed', response }` stores and replays that response,
     * 'not_committed' runs the handler under the same fence, 'unavailable'
     * (or a throw) answers 409 `outcome_unknown`. */
    reconcile?: MiddlewareReconcileHook<Req>;
    /** Called on every replay of a stored response; its answer is sent instead (see ReplayResponseHook). */
    onReplay?: ReplayResponseHook;
    /** Called with every escaped failure (default: console.error). */
    onError?: (err: unknown, req: Req) => void;
    logger?: Logger;
}
/** Mark a response as saying nothing happened: not stored, the lease is
 * released with not_committed, and a retry runs the handler again. Takes
 * what the framework answers with (Express/node:http `res`, Fastify
 * `reply`, a Fetch `Response`) and returns it. */
export declare function markRetryable<T extends object>(res: T): T;
/** Whether `markRetryable` marked one of these objects. */
export declare function isMarkedRetryable(...objects: unknown[]): boolean;
/** The principal and generation an extractor found, or null (no identity). */
export declare function principalParts(found: Principal): {
    principal: string;
    generation: number;
} | null;
/** The `principal` of an application with one caller: every request is
 * `name` (at `generation`; move it forward after revoking `name`). */
export declare function fixedPrincipal(name: string, generation?: number): PrincipalExtractor<unknown>;
/** The `principal` from the authenticated identity that an earlier
 * middleware or hook put in `req.user` (Passport/Express, @fastify/jwt,
 * @fastify/passport): no `req.user` → null (401
 * `idempotency_principal_missing`). The principal is `pick(user)` when given
 * (a string, `{ principal, generation? }` or null), else
 * `String(user.id ?? user.username)` (null when it has neither). It must
 * name the account, never a token. */
export declare function authenticatedPrincipal(pick?: (user: any) => Principal | Promise<Principal>): PrincipalExtractor<object>;
/** Every field line of the header `name` (lower case) of a Node request, in order. */
export declare function rawHeaderValues(req: IncomingMessage, name: string): string[];
/** Every header of a Node request as [name in lower case, value], in order. */
export declare function rawHeaderEntries(req: IncomingMessage): [string, string][];
/** The path (without the query) and the request target of a raw URL as
 * sent: "/p?" and "/p" are one target, as in ASGI. */
export declare function pathAndTarget(url: string): {
    path: string;
    target: string;
};
/** A request as the engine sees it. */
export interface CoreRequest<Req> {
    /** The framework's request: given to the principal extractor, the reconcile hook and onError. */
    req: Req;
    method: string;
    /** The path without its query (route selection). */
    path: string;
    /** The request target: the path with its query, as sent. */
    target: string;
    /** Every field line of a header (the name in lower case); [] when absent. */
    headerValues(name: string): string[];
    /** Every header as [name in lower case, value], for the reconcile hook. */
    headerEntries?(): [string, string][];
    /** The body's bytes ('too_large' past `maxBytes`); called once, after the key and the principal were found. */
    body(maxBytes: number): Promise<Uint8Array | 'too_large'>;
}
/** An answer to send as it is. */
export interface CoreResponse {
    status: number;
    headers: [string, string][];
    body: Buffer;
}
/** A handler running under an execute lease (dispatched, heartbeated). */
export interface CoreRun {
    readonly key: string;
    readonly fence: number;
    readonly timeoutMs: number | null;
    /** The handler answered: settled `completed` (`failed` for a 5xx), or,
     * for a `releaseOn` status or `retryable`, released `not_committed`
     * (with `forget` for a status added to the default ones). Resolves when
     * the ledger knows (or gave up: logged); then send the response. */
    respond(status: number, headers: ReadonlyArray<readonly [string, string]>, body: Uint8Array, retryable?: boolean): Promise<void>;
    /** An escaped failure (a throw, a timeout): settled `unknown`; resolves to
     * the 500 `outcome_unknown` answer. The handler's `EffectNotSent`
     * (nothing was done): released `not_committed`, 503
     * `idempotency_unavailable` with `Retry-After: 1`. */
    fail(err: unknown, timeout: boolean): Promise<CoreResponse>;
}
export type Begun = 
/** Run the handler as without the middleware: the route is not wrapped, a
 * key is optional and absent, or the ledger is unreachable under failOpen. */
{
    kind: 'unwrapped';
}
/** Send this (a problem or a replay); the handler does not run. */
 | {
    kind: 'answer';
    response: CoreResponse;
}
/** Run the handler under the lease, then `run.respond` or `run.fail`. */
 | {
    kind: 'run';
    run: CoreRun;
};
export interface Engine<Req> {
    /** Replays and refusals by kind (SPEC §8: counted). */
    readonly stats: Record<string, number>;
    readonly maxRequestBody: number;
    begin(call: CoreRequest<Req>): Promise<Begun>;
}
/** An answer with a body: content-length set, the given headers (lower case). */
export declare function answer(status: number, headers: [string, string][], body: Buffer): CoreResponse;
/** A problem+json answer. */
export declare function problemResponse(status: number, code: string, detail: string, extra?: [string, string][]): CoreResponse;
/** The SPEC §8 engine for one adapter (`who` names its factory in errors). */
export declare function createEngine<Req>(options: CoreOptions<Req>, who?: string): Engine<Req>;
/** The class of what a handler threw, as the logs and the stored
 * `unknown` outcome name it (Python's `type(e).__name__`): an Error's
 * `name` (the SDK's errors set it to their class), else its type. */
export declare function errorName(err: unknown): string;
/** A reconcile hook's response as status, headers and body bytes (a body
 * that is neither a string nor bytes as JSON, with its content-type). */
export declare function foundResponse(r: ReconciledResponse): {
    status: number;
    headers: [string, string][];
    body: Buffer;
};
