import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Client } from './client.js';
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
/** The response a middleware reconcile hook found: what the first request's
 * handler answered (e.g. rebuilt from the upstream's record). A body that is
 * neither a string nor bytes is sent as JSON (content-type
 * application/json unless given). */
export interface ReconciledResponse {
    status: number;
    headers?: Record<string, string> | ReadonlyArray<readonly [string, string]>;
    body?: string | Uint8Array | unknown;
}
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
    /** The request body's bytes (the stream itself is left for the handler). */
    body: Buffer;
}
/** Asked when a retry finds the record `unknown`: the ledger key, the
 * reconcile lease's fence, the retried request (read its headers; do not
 * consume its stream, the handler may still need it) and `info` (the key,
 * the principal and the body's bytes). */
export type MiddlewareReconcileHook = (ledgerKey: string, fence: number, req: IncomingMessage, info: ReconcileRequestInfo) => Promise<MiddlewareFinding> | MiddlewareFinding;
/** The `principal` option: the request → its caller. It must name the
 * caller's account, stable across credential refresh: never a token or a
 * header value (a retry sent after an OAuth refresh must replay). */
export type PrincipalExtractor = (req: IncomingMessage) => Principal | Promise<Principal>;
export interface IdempotencyOptions {
    client: Client;
    /** Required: who the caller is (see `fixedPrincipal`, `authenticatedPrincipal`). */
    principal: PrincipalExtractor;
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
    unavailableRetryAfterS?: number;
    /** Resolves a record left unknown when a retry arrives (SPEC §8):
     * `{ finding: 'committed', response }` stores and replays that response,
     * 'not_committed' runs the handler under the same fence, 'unavailable'
     * (or a throw) answers 409 `outcome_unknown`. */
    reconcile?: MiddlewareReconcileHook;
    /** Called with every escaped failure (default: console.error). */
    onError?: (err: unknown, req: IncomingMessage) => void;
    logger?: Logger;
}
type Next = (err?: unknown) => void;
export interface IdempotencyMiddleware {
    (req: IncomingMessage, res: ServerResponse, next: Next): void;
    /** Express error middleware: an escaped error of a wrapped request → unknown. */
    errorHandler: (err: unknown, req: IncomingMessage, res: ServerResponse, next: Next) => void;
    /** Replays and refusals by kind (SPEC §8: counted). */
    readonly stats: Record<string, number>;
    /** Plain node:http: run `handler` behind the middleware; a throw or rejection is an escaped failure. */
    wrap(handler: (req: IncomingMessage, res: ServerResponse) => unknown): (req: IncomingMessage, res: ServerResponse) => void;
}
/** Mark the response as saying nothing happened: not stored, the lease is
 * released with not_committed, and a retry runs the handler again. */
export declare function markRetryable(res: ServerResponse): void;
/** The `principal` of an application with one caller: every request is
 * `name` (at `generation`; move it forward after revoking `name`). */
export declare function fixedPrincipal(name: string, generation?: number): PrincipalExtractor;
/** The `principal` from the authenticated identity that an earlier
 * middleware put in `req.user` (the Passport/Express convention): no
 * `req.user` → null (401 `idempotency_principal_missing`). The principal is
 * `pick(user)` when given (a string, `{ principal, generation? }` or null),
 * else `String(user.id ?? user.username)` (null when it has neither). It
 * must name the account, never a token. */
export declare function authenticatedPrincipal(pick?: (user: any) => Principal | Promise<Principal>): PrincipalExtractor;
export declare function idempotency(options: IdempotencyOptions): IdempotencyMiddleware;
export {};
