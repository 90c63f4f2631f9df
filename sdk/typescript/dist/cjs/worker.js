"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.SettleError = exports.Deadline = void 0;
exports.isRetryable = isRetryable;
exports.retrying = retrying;
exports.startHeartbeat = startHeartbeat;
exports.askHook = askHook;
exports.encodeResult = encodeResult;
exports.doneToOutcome = doneToOutcome;
exports.runOnce = runOnce;
exports.makeIdempotent = makeIdempotent;
const errors_js_1 = require("./errors.js");
Object.defineProperty(exports, "SettleError", { enumerable: true, get: function () { return errors_js_1.SettleError; } });
const jcs_js_1 = require("./jcs.js");
const MAX_TIMER = 2 ** 31 - 1;
/** Sleeps `ms`; an abort of `signal` ends the sleep early with its reason. */
function sleep(ms, signal) {
    return new Promise((resolve, reject) => {
        if (signal?.aborted)
            return reject(signal.reason);
        const done = () => {
            signal?.removeEventListener('abort', onAbort);
            resolve();
        };
        const timer = setTimeout(done, Math.min(ms, MAX_TIMER));
        const onAbort = () => {
            clearTimeout(timer);
            reject(signal.reason);
        };
        signal?.addEventListener('abort', onAbort, { once: true });
    });
}
class Deadline {
    /** Epoch ms, or null: none. */
    at;
    /** `ms` from now (null: no deadline); with `absolute`, `ms` is the epoch ms itself. */
    constructor(ms, absolute = false) {
        this.at = ms === null ? null : absolute ? ms : Date.now() + ms;
    }
    left() {
        return this.at === null ? Infinity : this.at - Date.now();
    }
    /** This deadline, or `ms` from now when that is later. */
    atLeast(ms) {
        const t = Date.now() + ms;
        return this.at !== null && t > this.at ? new Deadline(t, true) : this;
    }
}
exports.Deadline = Deadline;
/** No answer, 503 `unavailable` or a 429 of settle: worth the same call again later. */
function isRetryable(e) {
    return e instanceof errors_js_1.TransportError || e instanceof errors_js_1.Unavailable || (e instanceof errors_js_1.ProblemError && e.status === 429);
}
function backoffMs(n, e) {
    const base = Math.min(1000, 50 * 2 ** Math.min(n, 10));
    let wait = base / 2 + (Math.random() * base) / 2;
    // Retry-After is honoured: never sooner than the server asked.
    if (e instanceof errors_js_1.ProblemError && e.retryAfterS !== null && Number.isFinite(e.retryAfterS) && e.retryAfterS > 0) {
        wait = Math.max(wait, e.retryAfterS * 1000);
    }
    return wait;
}
/** Retry `fn` on no answer, 503 `unavailable` and 429 (honouring
 * Retry-After) until the deadline; then DeadlineExceeded (`cause`: the
 * last error). Anything else is thrown at once. `fn` is the same call every
 * time (SPEC §11.11: a lost call is retried with identical arguments). An
 * abort of `signal` ends the retries with its reason. */
async function retrying(fn, deadline, what, signal) {
    for (let n = 0;; n++) {
        if (signal?.aborted)
            throw signal.reason;
        try {
            return await fn();
        }
        catch (e) {
            if (!isRetryable(e))
                throw e;
            const wait = backoffMs(n, e);
            if (deadline.left() < wait)
                throw new errors_js_1.DeadlineExceeded(`${what}: deadline passed after ${n + 1} tries`, { cause: e });
            await sleep(wait, signal);
        }
    }
}
/** Heartbeats every leaseMs/3 until stopped; aborts `controller` when the
 * lease is lost; each heartbeat answered moves `clock.renewedAt`. */
function startHeartbeat(client, key, fence, leaseMs, controller, clock = { renewedAt: Date.now() }) {
    let stopped = false;
    let timer;
    const beat = async () => {
        if (stopped)
            return;
        const sent = Date.now();
        try {
            await client.heartbeat(key, fence);
            clock.renewedAt = Math.max(clock.renewedAt, sent);
        }
        catch (e) {
            if (!isRetryable(e)) {
                controller.abort(e); // expired, revoked or taken over: tell the effect
                return;
            }
        }
        if (!stopped)
            timer = setTimeout(beat, leaseMs / 3);
    };
    timer = setTimeout(beat, leaseMs / 3);
    return {
        stop() {
            stopped = true;
            if (timer)
                clearTimeout(timer);
        },
        leaseEnd: () => clock.renewedAt + leaseMs,
    };
}
/** Asks a reconcile hook, bounded by `timeoutMs` (SPEC §8, §11.10,
 * §11.11): past it, rejects with HookTimeout; an abort of `outer` rejects
 * with its reason. The hook gets a signal that is aborted in both cases. */
async function askHook(ask, timeoutMs, outer) {
    const ac = new AbortController();
    let timer;
    const onOuter = () => ac.abort(outer.reason);
    try {
        return await new Promise((resolve, reject) => {
            ac.signal.addEventListener('abort', () => reject(ac.signal.reason), { once: true });
            if (outer) {
                if (outer.aborted)
                    return ac.abort(outer.reason);
                outer.addEventListener('abort', onOuter, { once: true });
            }
            if (timeoutMs < MAX_TIMER)
                timer = setTimeout(() => ac.abort(new errors_js_1.HookTimeout(timeoutMs)), Math.max(0, timeoutMs));
            Promise.resolve()
                .then(() => ask(ac.signal))
                .then(resolve, reject);
        });
    }
    finally {
        if (timer)
            clearTimeout(timer);
        outer?.removeEventListener('abort', onOuter);
    }
}
function typeName(v) {
    switch (typeof v) {
        case 'bigint':
            return 'BigInt';
        case 'symbol':
            return 'Symbol';
        case 'function':
            return 'function';
        case 'undefined':
            return 'undefined';
        case 'number':
            return String(v); // NaN, Infinity, -Infinity
        case 'string':
            return 'string with a lone surrogate';
        default: {
            const ctor = Object.getPrototypeOf(v)?.constructor?.name;
            return ctor || 'object';
        }
    }
}
function hasLoneSurrogate(s) {
    return /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s);
}
const pointerToken = (k) => k.replace(/~/g, '~0').replace(/\//g, '~1');
function encodeValue(v, serializer, path, depth, fromSerializer) {
    if (depth > 1000)
        throw new errors_js_1.ResultNotSerializable('value nested deeper than 1000', path);
    if (v === null || typeof v === 'boolean')
        return v;
    if (typeof v === 'number' && Number.isFinite(v))
        return v;
    if (typeof v === 'string' && !hasLoneSurrogate(v))
        return v;
    if (typeof v === 'object') {
        const withJson = v;
        if (typeof withJson.toJSON === 'function')
            return encodeValue(withJson.toJSON(), serializer, path, depth + 1, false); // Date, as JSON.stringify
        if (Array.isArray(v)) {
            // An undefined element is null, as in JSON.stringify.
            return v.map((item, i) => (item === undefined ? null : encodeValue(item, serializer, `${path}/${i}`, depth + 1, false)));
        }
        const proto = Object.getPrototypeOf(v);
        if (proto === Object.prototype || proto === null) {
            const out = {};
            for (const [k, item] of Object.entries(v)) {
                if (item === undefined)
                    continue; // an undefined member is absent, as in JSON.stringify
                out[k] = encodeValue(item, serializer, `${path}/${pointerToken(k)}`, depth + 1, false);
            }
            return out;
        }
    }
    // Not JSON: a BigInt, a Map, a Set, a class instance, NaN, a function, ...
    if (serializer && !fromSerializer) {
        let json;
        try {
            json = serializer(v);
        }
        catch (e) {
            throw new errors_js_1.ResultNotSerializable(typeName(v), path, { cause: e });
        }
        return encodeValue(json, serializer, path, depth + 1, true);
    }
    if (fromSerializer)
        throw new errors_js_1.ResultNotSerializable(`${typeName(v)} (returned by the serializer)`, path);
    throw new errors_js_1.ResultNotSerializable(typeName(v), path);
}
/** The JSON form of an effect's result: plain objects, arrays, strings,
 * finite numbers, booleans and null as they are (`toJSON` honoured, an
 * undefined member left out, an undefined result null); anything else goes
 * through `serializer`, or throws ResultNotSerializable naming its type. */
function encodeResult(value, serializer) {
    return value === undefined ? null : encodeValue(value, serializer, '', 0, false);
}
function doneToOutcome(d, serializer) {
    if (!d || typeof d !== 'object' || !('result' in d))
        throw new TypeError('the effect must return { result, response?, failed? }');
    const result = encodeResult(d.result, serializer);
    const canonical = (0, jcs_js_1.canonicalize)(result); // validates the result before anything is stored
    const raw = d.response ?? canonical;
    return { status: d.failed ? 'failed' : 'completed', result: result, responseSha256: (0, jcs_js_1.sha256Hex)(raw) };
}
const MAX_ERROR = 1000;
function clip(msg) {
    return msg.length > MAX_ERROR ? msg.slice(0, MAX_ERROR - 1) + '…' : msg;
}
function messageOf(e) {
    return e instanceof Error ? e.message : String(e);
}
function unknownOutcome(e) {
    const what = messageOf(e);
    const msg = e instanceof errors_js_1.ResultNotSerializable ? what : `the effect failed after it may have reached the remote: ${what}`;
    return { status: 'unknown', error: clip(msg) };
}
/** A 409 problem of the ledger (lease_expired, stale_fence, ...): the lease is not ours any more. */
function isRefusal(e) {
    return e instanceof errors_js_1.ProblemError && e.status === 409;
}
/** The deadline of a call that must be answered for the run to go on
 * (dispatch, the settle of the outcome, a reconcile finding): the run's,
 * and at least a third of the lease from now (one retry window even for an
 * effect that ran past the run's deadline). */
function callDeadline(s) {
    return s.dl.atLeast(s.leaseMs / 3);
}
/** The deadline of a call that hands the lease back (release, the settle of
 * `unknown` after a failure, reconcile(unavailable)): past the run's, up to
 * the lease's end, so that the record is not left held. */
function cleanupDeadline(s, hb) {
    const end = hb.leaseEnd();
    return s.dl.at !== null && s.dl.at > end ? s.dl : new Deadline(end, true);
}
/** SPEC §11: run `effect` at most once for `key`. */
async function runOnce(client, key, request, effect, options) {
    const fp = options.fingerprint ?? (0, jcs_js_1.fingerprint)(request, options.fields);
    const binding = { principal: options.principal, scopes: options.scopes ?? [], generation: options.generation ?? 0 };
    const leaseMs = options.leaseMs ?? 30_000;
    const marksDispatch = options.marksDispatch ?? false;
    const dl = new Deadline(options.deadlineMs === undefined ? 30_000 : options.deadlineMs);
    const hookTimeoutMs = options.hookTimeoutMs ?? leaseMs;
    const step = { client, key, fp, binding, leaseMs, marksDispatch, dl, hookTimeoutMs, serializer: options.serializer };
    for (;;) {
        // One claim: one claim_id, sent again only by the retries of this claim
        // (its answer was lost: the ledger answers with the same grant).
        const claimId = (0, jcs_js_1.newClaimId)();
        const clock = { renewedAt: Date.now() };
        const dec = await retrying(() => client.claim(key, fp, binding, {
            leaseMs,
            marksDispatch,
            claimId,
            ...(options.worker !== undefined ? { worker: options.worker } : {}),
            ...(options.retentionS !== undefined ? { retentionS: options.retentionS } : {}),
        }), dl, 'claim');
        if (dec.decision === 'replay') {
            const outcome = dec.outcome;
            const result = options.onReplay ? await options.onReplay(outcome, dec.receipt) : outcome.result;
            return { result, outcome, receipt: dec.receipt, replayed: true, fence: null, reconciled: false };
        }
        if (dec.decision === 'in_flight') {
            const wait = dec.retryAfterMs * (1 + Math.random() * 0.25); // at or above the server's hint
            if (dl.left() < wait)
                throw new errors_js_1.DeadlineExceeded(`operation ${JSON.stringify(key)} still in flight at the deadline`);
            await sleep(wait);
            continue;
        }
        let grant = dec;
        if (grant.decision === 'reconcile') {
            const found = options.reconcile === 'resend' ? await resendStep(step, grant, effect, clock) : await reconcileStep(step, grant, options.reconcile, clock);
            if ('outcome' in found)
                return found;
            grant = found;
        }
        return executeStep(step, grant, effect, clock);
    }
}
/** Hands a reconcile lease back (the record stays `unknown`); a failure to
 * do so leaves the lease to lapse, with the same effect. */
async function handBackReconcile(s, fence, hb) {
    try {
        await retrying(() => s.client.reconcile(s.key, fence, 'unavailable'), cleanupDeadline(s, hb), 'reconcile');
    }
    catch {
        // the reconcile lease lapses: the record stays unknown all the same
    }
}
async function reconcileStep(s, grant, hook, clock) {
    const { client, key, fp, binding, leaseMs } = s;
    const fence = grant.fence;
    const hb = startHeartbeat(client, key, fence, leaseMs, new AbortController(), clock);
    try {
        let finding;
        try {
            finding = hook ? await askHook((signal) => hook(key, fence, { signal }), s.hookTimeoutMs) : 'unavailable';
        }
        catch (e) {
            // A hook that throws or runs past hookTimeoutMs cannot tell: unavailable.
            await handBackReconcile(s, fence, hb);
            throw new errors_js_1.OutcomeUnknown(key, null, e);
        }
        if (typeof finding === 'object' && finding !== null) {
            let outcome;
            try {
                outcome = doneToOutcome(finding, s.serializer);
            }
            catch (e) {
                await handBackReconcile(s, fence, hb);
                throw e;
            }
            let r;
            try {
                r = await retrying(() => client.reconcile(key, fence, 'committed', { fingerprint: fp, binding, outcome }), callDeadline(s), 'reconcile');
            }
            catch (e) {
                if (e instanceof errors_js_1.InvalidRequest) {
                    await handBackReconcile(s, fence, hb); // refused 422 (a result over max_result_bytes): it stays unknown
                    throw new errors_js_1.OutcomeUnknown(key, null, e, outcome);
                }
                if (e instanceof errors_js_1.DeadlineExceeded)
                    throw new errors_js_1.OutcomeUnknown(key, null, e, outcome);
                throw e;
            }
            return { result: outcome.result, outcome, receipt: r, replayed: false, fence, reconciled: true };
        }
        if (finding === 'not_committed') {
            return (await retrying(() => client.reconcile(key, fence, 'not_committed'), callDeadline(s), 'reconcile'));
        }
        await handBackReconcile(s, fence, hb);
        throw new errors_js_1.ReconcileRequired(key, fence, hook ? 'the reconcile hook could not tell (unavailable)' : 'no reconcile hook was given');
    }
    finally {
        hb.stop();
    }
}
/** SPEC §11.9: the effect again, with the same key, under the reconcile
 * lease (the remote de-duplicates by the key); its dispatch() is a local
 * no-op. Success → committed; any failure → unavailable. */
async function resendStep(s, grant, effect, clock) {
    const { client, key, fp, binding, leaseMs } = s;
    const ac = new AbortController();
    const hb = startHeartbeat(client, key, grant.fence, leaseMs, ac, clock);
    let marked = false;
    const ctx = {
        key,
        fence: grant.fence,
        attempt: grant.attempt,
        signal: ac.signal,
        get dispatched() {
            return marked;
        },
        async dispatch() {
            marked = true; // a reconcile lease cannot dispatch: nothing to record
        },
    };
    try {
        let outcome;
        try {
            outcome = doneToOutcome(await effect(ctx), s.serializer);
        }
        catch (e) {
            await handBackReconcile(s, grant.fence, hb);
            throw new errors_js_1.ReconcileRequired(key, grant.fence, `the resend failed: ${messageOf(e)}`, { cause: e });
        }
        const r = await retrying(() => client.reconcile(key, grant.fence, 'committed', { fingerprint: fp, binding, outcome }), callDeadline(s), 'reconcile');
        return { result: outcome.result, outcome, receipt: r, replayed: false, fence: grant.fence, reconciled: true };
    }
    finally {
        hb.stop();
    }
}
async function executeStep(s, grant, effect, clock) {
    const { client, key, fp, binding, leaseMs, marksDispatch } = s;
    const fence = grant.fence;
    const lost = new AbortController(); // the lease was lost (a heartbeat was refused)
    // The run is over: a dispatch() still retrying stops. Made by the first
    // dispatch() that goes to the ledger (most runs never need one).
    let over;
    let dispatch = { s: 'none' };
    let dispatching = null;
    const ctx = {
        key,
        fence,
        attempt: grant.attempt,
        signal: lost.signal,
        get dispatched() {
            return dispatch.s === 'done';
        },
        dispatch() {
            if (!marksDispatch || dispatch.s === 'done') {
                dispatch = { s: 'done' };
                return Promise.resolve();
            }
            if (dispatch.s === 'pending' && dispatching)
                return dispatching;
            dispatch = { s: 'pending' };
            // A dispatch whose answer was lost is retried under the same fence
            // (the ledger answers a repeated dispatch alike).
            over ??= new AbortController();
            const p = retrying(() => client.dispatch(key, fence), callDeadline(s), 'dispatch', over.signal).then(() => {
                dispatch = { s: 'done' };
            }, (e) => {
                dispatch = { s: 'failed', error: e };
                throw e;
            });
            p.catch(() => { }); // a dispatch() the effect does not await never becomes an unhandled rejection
            dispatching = p;
            return p;
        },
    };
    const hb = startHeartbeat(client, key, fence, leaseMs, lost, clock);
    /** The settle of `unknown` that hands the lease back; null when it could not be done (the lease lapses: `unknown`). */
    const settleUnknown = async (outcome, sdl) => {
        try {
            return await retrying(() => client.settle(key, fence, fp, binding, outcome), sdl, 'settle');
        }
        catch {
            return null;
        }
    };
    /** Releases the lease; `callerWord`: the effect itself said nothing was
     * applied (EffectNotSent / EffectRefused), which alone allows
     * `not_committed` after the ledger refused `not_dispatched`. */
    const handBack = async (reason, callerWord, cause, nothingMarked) => {
        const sdl = cleanupDeadline(s, hb);
        try {
            await retrying(() => client.release(key, fence, reason), sdl, 'release');
            return { released: true };
        }
        catch (e) {
            if (e instanceof errors_js_1.ReceiptRequired && reason === 'not_dispatched' && callerWord) {
                // The ledger recorded the mark; the caller attests nothing was applied.
                return handBackNotCommitted(cause, sdl);
            }
            if (e instanceof errors_js_1.ReceiptRequired || e instanceof errors_js_1.InvalidRequest) {
                // receipt_required: the ledger recorded the dispatch mark, so what
                // happened is unknown (never inferred: SPEC §11.11); invalid_request:
                // a server without release(not_committed). The safe record: unknown.
                return { released: false, receipt: await settleUnknown(unknownOutcome(cause), sdl) };
            }
            // No answer up to the lease's end, or the lease ended otherwise: it
            // lapses. With marksDispatch and nothing marked, nothing changes.
            return nothingMarked ? { released: true } : { released: false, receipt: null };
        }
    };
    const handBackNotCommitted = async (cause, sdl) => {
        try {
            await retrying(() => client.release(key, fence, 'not_committed'), sdl, 'release');
            return { released: true };
        }
        catch (e) {
            if (e instanceof errors_js_1.InvalidRequest)
                return { released: false, receipt: await settleUnknown(unknownOutcome(cause), sdl) };
            return { released: false, receipt: null };
        }
    };
    /** The effect threw `e` (or its result cannot be stored): SPEC §11.8, §11.11. */
    const failed = async (e) => {
        const d = dispatch; // where ctx.dispatch() stood when the effect ended
        if (d.s === 'pending')
            over?.abort(new Error('the run is over')); // called and not awaited: the boundary is crossed
        if (d.s === 'failed' && isRefusal(d.error))
            throw e; // the ledger refused the mark: the lease is not ours (lease_expired, stale_fence)
        const nothingMarked = marksDispatch && d.s === 'none';
        if (e instanceof errors_js_1.EffectNotSent || e instanceof errors_js_1.EffectRefused) {
            const reason = e instanceof errors_js_1.EffectNotSent && marksDispatch && d.s !== 'done' ? 'not_dispatched' : 'not_committed';
            const r = await handBack(reason, true, e, nothingMarked);
            if (!r.released)
                throw new errors_js_1.OutcomeUnknown(key, r.receipt, e);
            throw e;
        }
        if (marksDispatch && (d.s === 'none' || d.s === 'failed')) {
            // Before the mark (nothing could have been sent), or the mark's call
            // failed: release not_dispatched and let the ledger decide.
            const r = await handBack('not_dispatched', false, e, nothingMarked);
            if (!r.released)
                throw new errors_js_1.OutcomeUnknown(key, r.receipt, e);
            if (d.s === 'failed' && e === d.error) {
                throw new errors_js_1.EffectNotSent(`ctx.dispatch() did not reach settle (${messageOf(e)}); the lease was released not_dispatched: nothing was sent`, { cause: e });
            }
            throw e;
        }
        // After the boundary (or without marksDispatch): unknown.
        throw new errors_js_1.OutcomeUnknown(key, await settleUnknown(unknownOutcome(e), cleanupDeadline(s, hb)), e);
    };
    try {
        let outcome;
        try {
            outcome = doneToOutcome(await effect(ctx), s.serializer);
        }
        catch (e) {
            return await failed(e);
        }
        if (dispatch.s === 'pending')
            over?.abort(new Error('the run is over')); // not awaited: crossed
        let receipt;
        try {
            receipt = await retrying(() => client.settle(key, fence, fp, binding, outcome), callDeadline(s), 'settle');
        }
        catch (e) {
            if (e instanceof errors_js_1.InvalidRequest) {
                // Refused 422 (e.g. a result over max_result_bytes): settled unknown at once, with that error.
                const r = await settleUnknown({ status: 'unknown', error: clip(`the outcome could not be recorded: ${e.message}`) }, cleanupDeadline(s, hb));
                throw new errors_js_1.OutcomeUnknown(key, r, e, outcome);
            }
            // Unanswered until the deadline: the lease lapses → unknown (or the
            // receipt, if a settle whose answer was lost was applied).
            if (e instanceof errors_js_1.DeadlineExceeded)
                throw new errors_js_1.OutcomeUnknown(key, null, e, outcome);
            throw e;
        }
        return { result: outcome.result, outcome, receipt, replayed: false, fence, reconciled: false };
    }
    finally {
        hb.stop();
        if (over && !over.signal.aborted)
            over.abort(new Error('the run is over'));
    }
}
/** SPEC §11.8: `fn` run at most once per key, through runOnce. `fn` gets
 * the original arguments and, last, the EffectContext (`ctx.dispatch()`
 * marks the commit boundary under marksDispatch; `ctx.key` and `ctx.fence`
 * go to the remote). The returned function resolves to `fn`'s result, or,
 * when the call was already settled, to the stored result (its JSON form:
 * the serializer's output, if one ran). Failures follow runOnce. */
function makeIdempotent(fn, options) {
    if (typeof fn !== 'function')
        throw new TypeError('makeIdempotent(fn, options): fn must be a function');
    if (!options || !options.client || typeof options.key !== 'function' || typeof options.principal !== 'string') {
        throw new TypeError('makeIdempotent(fn, { client, key: (...args) => string, principal, ... })');
    }
    const { client, key, request, ...rest } = options;
    const run = async (args) => {
        let produced = null;
        const r = await runOnce(typeof client === 'function' ? client() : client, key(...args), request ? request(...args) : args, async (ctx) => {
            produced = null;
            const value = await fn(...args, ctx);
            produced = { value };
            return { result: value };
        }, rest);
        return { r, produced };
    };
    const wrapped = (async (...args) => {
        const { r, produced } = await run(args);
        return produced && !r.replayed && !r.reconciled ? produced.value : r.result;
    });
    wrapped.run = async (...args) => (await run(args)).r;
    return wrapped;
}
