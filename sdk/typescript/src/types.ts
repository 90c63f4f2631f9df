// Typed views of the SPEC §7 answers. Field names are camelCase; the wire
// is snake_case. Fences and generations are JavaScript numbers: exact over
// the whole SPEC §2 range [0, 2^53 − 1] (Number.MAX_SAFE_INTEGER).
import type { ProblemError } from './errors.js';

export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

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
  lease: { fence: number; purpose: string; expiresAt: string; dispatched: boolean | null } | null;
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
  byStatus: { pending: number; running: number; unknown: number; conflict: number; failed: number; completed: number };
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
  reservation: { fingerprint: string; principal: string; scopes: string[]; generation: number };
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

type W = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

export function outcomeFromWire(d: W): Outcome {
  return { status: d.status, result: d.result ?? null, responseSha256: d.response_sha256 ?? null, error: d.error ?? null };
}

export function outcomeToWire(o: Outcome): W {
  const w: W = { status: o.status };
  if (o.status === 'completed' || o.status === 'failed' || o.result !== undefined) w.result = o.result ?? null;
  if (o.responseSha256 != null) w.response_sha256 = o.responseSha256;
  if (o.error != null) w.error = o.error;
  return w;
}

export function receiptFromWire(d: W): Receipt {
  return {
    key: d.key,
    fingerprint: d.fingerprint,
    responseSha256: d.response_sha256 ?? null,
    status: d.status,
    fence: d.fence,
    committedAt: d.committed_at,
    durable: d.durable,
  };
}

export function claimFromWire(d: W): ClaimDecision {
  switch (d.decision) {
    case 'execute':
    case 'reconcile':
      return { decision: d.decision, fence: d.fence, leaseExpiresAt: d.lease_expires_at, attempt: d.attempt };
    case 'in_flight':
      return { decision: 'in_flight', retryAfterMs: d.retry_after_ms, leaseExpiresAt: d.lease_expires_at ?? null };
    case 'replay':
      return { decision: 'replay', outcome: outcomeFromWire(d.outcome), receipt: receiptFromWire(d.receipt) };
    default:
      throw new TypeError(`unknown claim decision ${JSON.stringify(d.decision)}`);
  }
}

export function warningFromWire(d: W): WarningRecord {
  return {
    task: d.task,
    class: d.class,
    count: d.count,
    detail: d.detail ?? null,
    firstAt: d.first_at,
    lastAt: d.last_at,
    saturated: d.saturated,
  };
}

export function recordFromWire(d: W): OperationRecord {
  return {
    key: d.key,
    status: d.status,
    rank: d.rank,
    reservation: d.reservation,
    lease: d.lease ?? null,
    outcome: d.outcome ? outcomeFromWire(d.outcome) : null,
    receipt: d.receipt ? receiptFromWire(d.receipt) : null,
    reconcileRequired: d.reconcile_required,
    disputed: d.disputed,
    attempts: d.attempts ?? [],
    quarantine: d.quarantine ?? [],
    createdAt: d.created_at,
    updatedAt: d.updated_at,
    expiresAt: d.expires_at ?? null,
    raw: d,
  };
}

export function summaryFromWire(d: W): OperationSummary {
  const l = d.lease;
  return {
    key: d.key,
    status: d.status,
    rank: d.rank,
    reconcileRequired: d.reconcile_required,
    disputed: d.disputed,
    stuck: d.stuck,
    quarantined: d.quarantined,
    lease: l ? { fence: l.fence, purpose: l.purpose, expiresAt: l.expires_at, dispatched: l.dispatched ?? null } : null,
    attempts: d.attempts,
    createdAt: d.created_at,
    updatedAt: d.updated_at,
    expiresAt: d.expires_at ?? null,
    raw: d,
  };
}

export function statsFromWire(d: W): Stats {
  return {
    byStatus: d.by_status,
    total: d.total,
    reconcileRequired: d.reconcile_required,
    disputed: d.disputed,
    stuck: d.stuck,
    quarantined: d.quarantined,
    quarantinedRecords: d.quarantined_records,
    refused: d.refused,
    raw: d,
  };
}
