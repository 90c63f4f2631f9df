import type { FastifyPluginAsync, FastifyRequest } from 'fastify';
import type { CoreOptions } from './mwcore.js';
export { fixedPrincipal, authenticatedPrincipal, markRetryable } from './mwcore.js';
/** The options of the Fastify plugin: those of every adapter, on a FastifyRequest. */
export type FastifyIdempotencyOptions = CoreOptions<FastifyRequest>;
/** The plugin: `await app.register(idem)`. */
export type FastifyIdempotencyPlugin = FastifyPluginAsync & {
    /** Replays and refusals by kind (SPEC §8: counted). */
    readonly stats: Record<string, number>;
};
/** The Fastify plugin of the SPEC §8 middleware. */
export declare function idempotency(options: FastifyIdempotencyOptions): FastifyIdempotencyPlugin;
