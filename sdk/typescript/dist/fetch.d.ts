import type { CoreOptions } from './mwcore.js';
export { fixedPrincipal, authenticatedPrincipal, markRetryable } from './mwcore.js';
/** The options of `withIdempotency`: those of every adapter, on the handler's Request. */
export type FetchIdempotencyOptions<R extends Request = Request> = CoreOptions<R>;
/** A Fetch API handler: the request (and whatever else the framework passes) → a response. */
export type FetchHandler<R extends Request = Request, A extends unknown[] = unknown[]> = (request: R, ...rest: A) => Response | Promise<Response>;
/** The wrapped handler: the same arguments, a Promise of the response. */
export interface IdempotentFetchHandler<R extends Request = Request, A extends unknown[] = unknown[]> {
    (request: R, ...rest: A): Promise<Response>;
    /** Replays and refusals by kind (SPEC §8: counted). */
    readonly stats: Record<string, number>;
}
/** `handler` behind the SPEC §8 middleware. A throw or rejection of the
 * handler (or a value that is not a Response) is an escaped failure: 500
 * `outcome_unknown`, the record `unknown`. */
export declare function withIdempotency<R extends Request, A extends unknown[]>(handler: FetchHandler<R, A>, options: FetchIdempotencyOptions<R>): IdempotentFetchHandler<R, A>;
