import type { ProblemError } from './errors.js';
export type Json = null | boolean | number | string | Json[] | {
    [k: string]: Json;
};
export interface Binding {
    principal: string;
    scopes?: readonly string[];
    generation?: number;
}
export type OutcomeStatus = 'completed' | 'failed' | 'unknown';
/** A settled (or found) outcome; `R` types `result` (what the effect
 * returned, or, on a replay, its stored JSON form). */
export interface Outcome<R = unknown> {
    status: OutcomeStatus;
    result?: R;
    responseSha256?: string | null;
    error?: string | null;
}
export interface Receipt {
    key: string;
    fingerprint: string;
    responseSha256: string | null;
    status: string;
    fence: number;
    committedAt: string;
    durable: boolean;
}
export interface Grant {
    decision: 'execute' | 'reconcile';
    fence: number;
    leaseExpiresAt: string;
    attempt: number;
}
export interface InFlight {
    decision: 'in_flight';
    retryAfterMs: number;
    /** When the running lease expires (RFC 3339); null from a server that does not say. */
    leaseExpiresAt: string | null;
}
export interface Replay<R = unknown> {
    decision: 'replay';
    outcome: Outcome<R>;
    receipt: Receipt;
}
/** A claim's answer; `R` types a replay's `outcome.result` (its stored JSON form). */
export type ClaimDecision<R = unknown> = Grant | InFlight | Replay<R>;
export interface LeaseInfo {
    fence: number;
    leaseExpiresAt: string;
}
export interface Dispatched extends LeaseInfo {
    dispatched: boolean;
}
export interface Released {
    fence: number;
    released: boolean;
}
export interface Revoked {
    principal: string;
    generation: number;
}
export interface WarningRecord {
    task: string;
    class: string;
    count: number;
    detail: string | null;
    firstAt: string;
    lastAt: string;
    saturated: boolean;
}
/** A record of `list` (SPEC §9). */
export interface OperationSummary {
    key: string;
    status: string;
    rank: number;
    reconcileRequired: boolean;
    disputed: boolean;
    stuck: boolean;
    /** Quarantined evidence entries. */
    quarantined: number;
    lease: {
        fence: number;
        purpose: string;
        expiresAt: string;
        dispatched: boolean | null;
    } | null;
    /** The number of attempts. */
    attempts: number;
    createdAt: string;
    updatedAt: string;
    expiresAt: string | null;
    raw: Record<string, unknown>;
}
/** The filters of `list` (SPEC §9); every one optional. */
export interface ListParams {
    /** One status or several (`pending` includes `running`). */
    status?: string | readonly string[];
    reconcileRequired?: boolean;
    disputed?: boolean;
    stuck?: boolean;
    quarantined?: boolean;
    keyPrefix?: string;
    order?: 'key' | 'updated' | 'attention';
    /** 1–1000 (server default 100). */
    limit?: number;
    /** The `next` cursor of the previous page (with the same filters and order). */
    after?: string;
}
export interface OperationPage {
    operations: OperationSummary[];
    /** The cursor of the next page; null: the listing ended. */
    next: string | null;
}
/** `GET /v1/stats` (SPEC §9), for the caller's tenant. */
export interface Stats {
    byStatus: {
        pending: number;
        running: number;
        unknown: number;
        conflict: number;
        failed: number;
        completed: number;
    };
    total: number;
    reconcileRequired: number;
    disputed: number;
    stuck: number;
    /** Quarantined evidence entries. */
    quarantined: number;
    quarantinedRecords: number;
    refused: number;
    raw: Record<string, unknown>;
}
/** One call of a batch (SPEC §10): the op, the raw key, and the call's wire
 * fields (snake_case, as in the single call's body). */
export interface BatchCall {
    op: 'claim' | 'heartbeat' | 'dispatch' | 'settle' | 'release' | 'reconcile' | 'get';
    key: string;
    [field: string]: unknown;
}
/** One result of a batch: the status and body the single call would have
 * answered; `error` is the typed problem of a non-200 result. */
export interface BatchResult {
    status: number;
    body: unknown;
    error: ProblemError | null;
}
/** The record of `get` (SPEC §7): the main fields typed, the whole answer in `raw`; `R` types `outcome.result`. */
export interface OperationRecord<R = unknown> {
    key: string;
    status: string;
    rank: number;
    reservation: {
        fingerprint: string;
        principal: string;
        scopes: string[];
        generation: number;
    };
    lease: Record<string, unknown> | null;
    outcome: Outcome<R> | null;
    receipt: Receipt | null;
    reconcileRequired: boolean;
    disputed: boolean;
    attempts: Record<string, unknown>[];
    quarantine: Record<string, unknown>[];
    createdAt: string;
    updatedAt: string;
    expiresAt: string | null;
    raw: Record<string, unknown>;
}
type W = Record<string, any>;
export declare function outcomeFromWire(d: W): Outcome;
export declare function outcomeToWire(o: Outcome): W;
export declare function receiptFromWire(d: W): Receipt;
export declare function claimFromWire(d: W): ClaimDecision;
export declare function warningFromWire(d: W): WarningRecord;
export declare function recordFromWire(d: W): OperationRecord;
export declare function summaryFromWire(d: W): OperationSummary;
export declare function statsFromWire(d: W): Stats;
export {};
