import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Client } from './client.js';
export interface RoutePolicy {
    /** A request without a key gets 400 (else it runs unwrapped). Default true. */
    required?: boolean;
    /** Ledger unreachable: run the handler without idempotency (logged) instead of 503. */
    failOpen?: boolean;
    /** The handler counts as failed (unknown) after this many ms. Default: none. */
    timeoutMs?: number | null;
}
export interface Logger {
    info(msg: string): void;
    warn(msg: string): void;
    error(msg: string, err?: unknown): void;
}
export interface IdempotencyOptions {
    client: Client;
    /** Part of every ledger key (default "default"). */
    namespace?: string;
    /** Methods wrapped when `routes` is not given (default POST, PATCH). */
    methods?: string[];
    /** Per-route policy by method and path; null/undefined: not wrapped. */
    routes?: (method: string, path: string) => RoutePolicy | null | undefined;
    /** The principal of a request (default: SHA-256 of Authorization, or "anonymous"). */
    principal?: (req: IncomingMessage) => string;
    /** Headers stored and replayed besides content-type and location. */
    storedHeaders?: string[];
    /** Request headers that are part of the fingerprint. */
    fingerprintHeaders?: string[];
    /** RFC 8785 canonical JSON bodies in the fingerprint (key order, whitespace irrelevant). */
    canonicalJson?: boolean;
    /** Responses above this are settled with their digest and not replayed (default 32 KiB). */
    maxStoredBody?: number;
    /** Request bodies above this get 413 (default 1 MiB). */
    maxRequestBody?: number;
    leaseMs?: number;
    retentionS?: number;
    timeoutMs?: number | null;
    failOpen?: boolean;
    unavailableRetryAfterS?: number;
    /** Resolves a record left unknown: "not_committed" runs the handler again. */
    reconcile?: (ledgerKey: string, fence: number, req: IncomingMessage) => Promise<'not_committed' | 'unavailable'> | 'not_committed' | 'unavailable';
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
export declare function idempotency(options: IdempotencyOptions): IdempotencyMiddleware;
export {};
