// @settle/client: the TypeScript SDK of settle (SPEC §7, §8, §11).
export * from './errors.js';
export * from './types.js';
export { Client, newClaimId } from './client.js';
export { runOnce, makeIdempotent, encodeResult, } from './worker.js';
export { Reconciler } from './reconciler.js';
export { canonicalize, fingerprint, selectFields, sha256Hex, FingerprintError } from './jcs.js';
export { idempotency, markRetryable, fixedPrincipal, authenticatedPrincipal, } from './express.js';
export { withIdempotency } from './fetch.js';
export * as middlewareCore from './mwcore.js';
