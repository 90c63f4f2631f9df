import { type CACertificates } from './tls.js';
import { type BatchCall, type BatchResult, type Binding, type ClaimDecision, type Dispatched, type Grant, type LeaseInfo, type ListParams, type OperationPage, type OperationRecord, type Outcome, type Receipt, type Released, type Revoked, type Stats, type WarningRecord } from './types.js';
import { type Effect, type RunOptions, type RunResult } from './worker.js';
export interface ClientOptions {
    /** Base URL of a `settle serve`, e.g. http://127.0.0.1:7411 */
    url: string;
    /** Bearer token of the tenant (omit when authentication is off). */
    token?: string;
    /** Per-request timeout (default 10 000 ms). */
    timeoutMs?: number;
    /** A fetch implementation (default: the global fetch). Tests and proxies plug in here. */
    fetch?: typeof fetch;
    headers?: Record<string, string>;
    /** The CA certificate(s) to trust for an https `url`, PEM (a string or a
     * Buffer, one or a bundle, or an array of them), instead of Node's default
     * roots: a private CA, or the server's self-signed certificate. Requests
     * then go through a fetch on node:https whose Agent trusts them (loaded
     * on the first request). Not with `fetch` (set the trust of your own
     * fetch there); unused for an http `url`. */
    ca?: CACertificates;
}
export interface ClaimOptions {
    leaseMs?: number;
    worker?: string;
    marksDispatch?: boolean;
    retentionS?: number;
    /** SPEC §4 claim rule 5a: a random id of this claim (16–64 of
     * `[A-Za-z0-9_-]`, see `newClaimId`), sent again only when the same claim
     * is retried because its answer was lost; the ledger then answers with the
     * same grant instead of `in_flight`. runOnce, the middlewares and the
     * Reconciler draw one per claim. */
    claimId?: string;
}
export interface ReleaseOptions {
    /** SPEC §4 `release(…, forget)`: remove the record when nothing of it
     * remains (pending, never settled, no flag, no quarantine), so that its
     * key may be claimed afresh; else `receipt_required` and nothing changes. */
    forget?: boolean;
}
export { newClaimId } from './jcs.js';
export type ReconcileAnswer = Grant | Receipt | Released;
/** Every byte but the unreserved ones percent-encoded (SPEC §7 path segments). */
declare function seg(s: string): string;
export declare class Client {
    readonly url: string;
    private readonly token;
    private readonly timeoutMs;
    /** undefined until the fetch trusting `ca` is loaded (`tlsFetch`). */
    private fetchImpl;
    private tlsFetch;
    private readonly extraHeaders;
    constructor(options: ClientOptions);
    private send;
    /** One request and its answer: the status, the body's text and
     * `Retry-After`; `TransportError` when no answer arrived. What every
     * call goes through (`@settle/local` answers it in process). */
    protected exchange(method: string, path: string, headers: Record<string, string>, body: string | undefined): Promise<{
        status: number;
        text: string;
        retryAfter: string | null;
    }>;
    /** `R`: the type of a replay's stored result (not checked: the ledger holds JSON). */
    claim<R = unknown>(key: string, fingerprint: string, binding: Binding, options?: ClaimOptions): Promise<ClaimDecision<R>>;
    heartbeat(key: string, fence: number, leaseMs?: number): Promise<LeaseInfo>;
    dispatch(key: string, fence: number): Promise<Dispatched>;
    settle(key: string, fence: number, fingerprint: string, binding: Binding, outcome: Outcome): Promise<Receipt>;
    release(key: string, fence: number, reason?: 'not_dispatched' | 'not_committed' | null, options?: ReleaseOptions): Promise<Released>;
    reconcile(key: string, fence: number, finding: 'committed' | 'not_committed' | 'unavailable', options?: {
        fingerprint?: string;
        binding?: Binding;
        outcome?: Outcome;
    }): Promise<ReconcileAnswer>;
    /** `R`: the type of the stored result (not checked: the ledger holds JSON). */
    get<R = unknown>(key: string): Promise<OperationRecord<R>>;
    /** SPEC §9: one page of the tenant's records, filtered; pass `next` as
     * `after` (with the same filters) for the next page, until it is null. */
    list(params?: ListParams): Promise<OperationPage>;
    /** SPEC §9: the tenant's counts by status and flag. */
    stats(): Promise<Stats>;
    /** SPEC §10: several calls in one request, applied in order (not
     * atomically); one result per call, each what the single call would have
     * answered. */
    batch(calls: readonly BatchCall[]): Promise<BatchResult[]>;
    /** SPEC §7: the principal's current generation (0 for one never seen). */
    principal(principal: string): Promise<number>;
    revoke(principal: string): Promise<Revoked>;
    warn(task: string, cls: string, detail?: string): Promise<WarningRecord>;
    warnings(task: string): Promise<WarningRecord[]>;
    health(): Promise<{
        status: string;
    }>;
    ready(): Promise<{
        status: string;
    }>;
    metrics(): Promise<string>;
    openapi(): Promise<Record<string, unknown>>;
    /** SPEC §11: run `effect` at most once for `key` (see runOnce). */
    runOnce<R = unknown>(key: string, request: unknown, effect: Effect<R>, options: RunOptions<R>): Promise<RunResult<R>>;
}
export { seg as encodeSegment };
