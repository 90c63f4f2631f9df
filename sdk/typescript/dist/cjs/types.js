"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.outcomeFromWire = outcomeFromWire;
exports.outcomeToWire = outcomeToWire;
exports.receiptFromWire = receiptFromWire;
exports.claimFromWire = claimFromWire;
exports.warningFromWire = warningFromWire;
exports.recordFromWire = recordFromWire;
exports.summaryFromWire = summaryFromWire;
exports.statsFromWire = statsFromWire;
function outcomeFromWire(d) {
    return { status: d.status, result: d.result ?? null, responseSha256: d.response_sha256 ?? null, error: d.error ?? null };
}
function outcomeToWire(o) {
    const w = { status: o.status };
    if (o.status === 'completed' || o.status === 'failed' || o.result !== undefined)
        w.result = o.result ?? null;
    if (o.responseSha256 != null)
        w.response_sha256 = o.responseSha256;
    if (o.error != null)
        w.error = o.error;
    return w;
}
function receiptFromWire(d) {
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
function claimFromWire(d) {
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
function warningFromWire(d) {
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
function recordFromWire(d) {
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
function summaryFromWire(d) {
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
function statsFromWire(d) {
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
