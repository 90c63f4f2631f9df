import type { IncomingMessage, ServerResponse } from 'node:http';
import type { CoreOptions, Logger, MiddlewareFinding, MiddlewareReconcileHook as CoreReconcileHook, Principal, PrincipalExtractor as CorePrincipalExtractor, ReconciledResponse, ReconcileRequestInfo, RoutePolicy } from './mwcore.js';
export { fixedPrincipal, authenticatedPrincipal, markRetryable } from './mwcore.js';
export type { Logger, MiddlewareFinding, Principal, ReconciledResponse, ReconcileRequestInfo, RoutePolicy };
/** The `principal` option of the Express middleware: `req` → its caller. */
export type PrincipalExtractor = CorePrincipalExtractor<IncomingMessage>;
/** The `reconcile` option of the Express middleware. */
export type MiddlewareReconcileHook = CoreReconcileHook<IncomingMessage>;
/** The options of the Express middleware: those of every adapter (`CoreOptions`), on Node's request. */
export type IdempotencyOptions = CoreOptions<IncomingMessage>;
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
export declare function idempotency(options: IdempotencyOptions): IdempotencyMiddleware;
