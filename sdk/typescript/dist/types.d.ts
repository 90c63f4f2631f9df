export type Json = null | boolean | number | string | Json[] | {
    [k: string]: Json;
};
export interface Binding {
    principal: string;
    scopes?: readonly string[];
    generation?: number;
}
export type OutcomeStatus = 'completed' | 'failed' | 'unknown';
export interface Outcome {
    status: OutcomeStatus;
    result?: unknown;
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
}
export interface Replay {
    decision: 'replay';
    outcome: Outcome;
    receipt: Receipt;
}
export type ClaimDecision = Grant | InFlight | Replay;
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
/** The record of `get` (SPEC §7): the main fields typed, the whole answer in `raw`. */
export interface OperationRecord {
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
    outcome: Outcome | null;
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
export {};
