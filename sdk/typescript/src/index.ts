// @settle/client: the TypeScript SDK of settle (SPEC §7, §8, §11).
export * from './errors.js';
export * from './types.js';
export { Client, newClaimId, type ClientOptions, type ClaimOptions, type ReleaseOptions, type ReconcileAnswer } from './client.js';
export type { CACertificates } from './tls.js';
export {
  runOnce,
  makeIdempotent,
  encodeResult,
  type Done,
  type Effect,
  type EffectContext,
  type Finding,
  type IdempotentFunction,
  type IdempotentOptions,
  type ReconcileHook,
  type RunOptions,
  type RunResult,
  type Serializer,
} from './worker.js';
export { Reconciler, type ReconcileCounts, type ReconcilerOptions } from './reconciler.js';
export { canonicalize, fingerprint, selectFields, sha256Hex, FingerprintError } from './jcs.js';
export {
  idempotency,
  markRetryable,
  fixedPrincipal,
  authenticatedPrincipal,
  type IdempotencyMiddleware,
  type IdempotencyOptions,
  type MiddlewareFinding,
  type MiddlewareReconcileHook,
  type ReconciledResponse,
  type ReconcileRequestInfo,
  type Principal,
  type PrincipalExtractor,
  type RoutePolicy,
  type Logger,
} from './express.js';
export type { CoreOptions, ReplayedResponse, ReplayResponseHook } from './mwcore.js';
export { withIdempotency, type FetchHandler, type FetchIdempotencyOptions, type IdempotentFetchHandler } from './fetch.js';
export * as middlewareCore from './mwcore.js';
