"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.Reconciler = void 0;
const errors_js_1 = require("./errors.js");
const jcs_js_1 = require("./jcs.js");
const mwcore_js_1 = require("./mwcore.js");
const worker_js_1 = require("./worker.js");
const zero = () => ({ seen: 0, committed: 0, not_committed: 0, unavailable: 0, skipped: 0, errors: 0 });
const defaultLogger = { info: () => { }, warn: (m) => console.warn(m), error: (m, e) => console.error(m, e ?? '') };
/** The newest middleware `worker` field of the record's claims (SPEC §8:
 * reconcile claims copy it, so it survives the 32-attempt bound). */
function middlewareWorker(rec) {
    const fields = [rec.lease?.worker];
    for (let i = rec.attempts.length - 1; i >= 0; i--)
        fields.push(rec.attempts[i].lease?.worker);
    for (const w of fields)
        if ((0, mwcore_js_1.parseWorkerLabel)(w))
            return w;
    return null;
}
function isMiddlewareEntry(h) {
    return typeof h === 'object' && h !== null && h.middleware === true;
}
/** A sleep that an abort of `signal` ends early (resolving). */
function pause(ms, signal) {
    return new Promise((resolve) => {
        if (signal.aborted)
            return resolve();
        const done = () => {
            clearTimeout(timer);
            signal.removeEventListener('abort', done);
            resolve();
        };
        const timer = setTimeout(done, ms);
        signal.addEventListener('abort', done, { once: true });
    });
}
class Reconciler {
    /** Totals over every sweep since construction (the metrics of the background mode). */
    counts = zero();
    /** Sweeps finished. */
    sweeps = 0;
    /** The counts of the last finished sweep. */
    lastSweep = null;
    client;
    hooks;
    prefixes;
    log;
    leaseMs;
    hookTimeoutMs;
    pageSize;
    worker;
    serializer;
    loop = null;
    constructor(client, options) {
        if (!client)
            throw new TypeError('new Reconciler(client, { hooks }) needs a settle Client');
        if (!options || !options.hooks || typeof options.hooks !== 'object')
            throw new TypeError('new Reconciler(client, { hooks: { [keyPrefix]: hook } })');
        for (const [p, h] of Object.entries(options.hooks)) {
            if (isMiddlewareEntry(h)) {
                if (typeof h.hook !== 'function')
                    throw new TypeError(`the middleware hook of prefix ${JSON.stringify(p)} needs hook: (ledgerKey, fence, info) => finding`);
            }
            else if (typeof h !== 'function') {
                throw new TypeError(`the hook of prefix ${JSON.stringify(p)} must be a function (key, fence) => finding, or { middleware: true, hook }`);
            }
        }
        this.client = client;
        this.hooks = options.hooks;
        this.prefixes = Object.keys(options.hooks);
        this.log = options.logger ?? defaultLogger;
        this.leaseMs = options.leaseMs ?? 30_000;
        this.hookTimeoutMs = options.hookTimeoutMs ?? this.leaseMs;
        if (!(this.hookTimeoutMs > 0))
            throw new RangeError('new Reconciler(client, { hookTimeoutMs }): must be > 0');
        this.pageSize = options.pageSize ?? 100;
        this.worker = options.worker ?? 'settle-reconciler';
        this.serializer = options.serializer;
    }
    /** The prefix whose hook owns `key`: the longest that matches. */
    owner(key) {
        let best = null;
        for (const p of this.prefixes)
            if (key.startsWith(p) && (best === null || p.length > best.length))
                best = p;
        return best;
    }
    /** One pass over every prefix's records that need reconciliation. Never
     * rejects: a failure is counted under `errors` and logged. */
    sweep() {
        return this.sweepUntil(new AbortController().signal);
    }
    async sweepUntil(signal) {
        const c = zero();
        for (const prefix of this.prefixes) {
            if (signal.aborted)
                break;
            const hook = this.hooks[prefix];
            let after;
            do {
                let page;
                try {
                    page = await (0, worker_js_1.retrying)(() => this.client.list({
                        reconcileRequired: true,
                        // "" covers every key: the listing is asked without key_prefix.
                        ...(prefix !== '' ? { keyPrefix: prefix } : {}),
                        limit: this.pageSize,
                        ...(after !== undefined ? { after } : {}),
                    }), new worker_js_1.Deadline(this.leaseMs), 'list', signal);
                }
                catch (e) {
                    if (signal.aborted)
                        break;
                    c.errors++;
                    this.log.error(`reconciler: listing the records of prefix ${JSON.stringify(prefix)} failed`, e);
                    break;
                }
                for (const op of page.operations) {
                    if (signal.aborted)
                        break;
                    if (this.owner(op.key) !== prefix)
                        continue; // a longer prefix's hook owns it
                    c.seen++;
                    c[await this.one(op.key, hook, signal)]++;
                }
                after = page.next ?? undefined;
            } while (after !== undefined && !signal.aborted);
        }
        for (const k of Object.keys(c))
            this.counts[k] += c[k];
        this.sweeps++;
        this.lastSweep = c;
        return c;
    }
    async one(key, hook, signal) {
        const { client, leaseMs } = this;
        const dl = () => new worker_js_1.Deadline(leaseMs);
        let fence = null;
        try {
            const rec = await (0, worker_js_1.retrying)(() => client.get(key), dl(), 'get', signal);
            if (!rec.reconcileRequired) {
                this.log.info(`reconciler: ${key} skipped (resolved meanwhile)`);
                return 'skipped';
            }
            const { fingerprint, principal, scopes } = rec.reservation;
            const generation = await (0, worker_js_1.retrying)(() => client.principal(principal), dl(), 'principal', signal);
            const binding = { principal, scopes, generation };
            const mwWorker = middlewareWorker(rec);
            // One claim_id: a retry of a claim whose answer was lost gets the same grant (SPEC §4 rule 5a).
            const claimId = (0, jcs_js_1.newClaimId)();
            const clock = { renewedAt: Date.now() };
            const dec = await (0, worker_js_1.retrying)(() => client.claim(key, fingerprint, binding, { marksDispatch: true, leaseMs, worker: mwWorker ?? this.worker, claimId }), dl(), 'claim', signal);
            if (dec.decision === 'execute') {
                // Someone resolved it meanwhile: this lease never dispatched.
                await (0, worker_js_1.retrying)(() => client.release(key, dec.fence, 'not_dispatched'), dl(), 'release');
                this.log.info(`reconciler: ${key} skipped (resolved meanwhile; execute lease ${dec.fence} released)`);
                return 'skipped';
            }
            if (dec.decision !== 'reconcile') {
                this.log.info(`reconciler: ${key} skipped (${dec.decision})`);
                return 'skipped';
            }
            fence = dec.fence;
            const f = fence;
            const hb = (0, worker_js_1.startHeartbeat)(client, key, f, leaseMs, new AbortController(), clock);
            // The calls that hand the lease back retry up to the lease's end.
            const cleanup = () => new worker_js_1.Deadline(Math.max(hb.leaseEnd(), Date.now() + 1000), true);
            const unavailable = () => (0, worker_js_1.retrying)(() => client.reconcile(key, f, 'unavailable'), cleanup(), 'reconcile');
            try {
                let outcome;
                let finding;
                try {
                    if (isMiddlewareEntry(hook)) {
                        const parsed = (0, mwcore_js_1.parseWorkerLabel)(mwWorker);
                        const found = await (0, worker_js_1.askHook)((s) => hook.hook(key, f, { idempotencyKey: parsed?.idempotencyKey ?? null, principal: parsed?.principal ?? null, worker: mwWorker, signal: s }), this.hookTimeoutMs, signal);
                        finding = typeof found === 'object' && found !== null && found.finding === 'committed' ? 'committed' : found;
                        outcome = finding === 'committed' ? this.storedResponse(found, hook) : {};
                    }
                    else {
                        const found = await (0, worker_js_1.askHook)((s) => hook(key, f, { signal: s }), this.hookTimeoutMs, signal);
                        finding = typeof found === 'object' && found !== null ? 'committed' : found;
                        outcome = finding === 'committed' ? (0, worker_js_1.doneToOutcome)(found, this.serializer) : {};
                    }
                }
                catch (e) {
                    await unavailable().catch((e2) => this.log.warn(`reconciler: reconcile(unavailable) of ${key} failed: ${String(e2)}`));
                    const why = e instanceof errors_js_1.HookTimeout ? 'ran past hookTimeoutMs' : signal.aborted ? 'was abandoned by stop()' : 'failed';
                    this.log.error(`reconciler: the hook ${why} for ${key} (fence ${f}); it stays unknown`, e);
                    return 'errors';
                }
                if (finding === 'committed') {
                    await (0, worker_js_1.retrying)(() => client.reconcile(key, f, 'committed', { fingerprint, binding, outcome }), dl(), 'reconcile');
                    this.log.info(`reconciler: ${key} committed (fence ${f}, ${outcome.status})`);
                    return 'committed';
                }
                if (finding === 'not_committed') {
                    const g = (await (0, worker_js_1.retrying)(() => client.reconcile(key, f, 'not_committed'), dl(), 'reconcile'));
                    // The execute lease it is handed never dispatched: the next claim executes.
                    await (0, worker_js_1.retrying)(() => client.release(key, g.fence, 'not_dispatched'), cleanup(), 'release');
                    this.log.info(`reconciler: ${key} not_committed (fence ${f}); the next run executes`);
                    return 'not_committed';
                }
                if (finding !== 'unavailable')
                    this.log.error(`reconciler: the hook for ${key} returned ${JSON.stringify(finding)}; taken as unavailable`);
                await unavailable();
                this.log.info(`reconciler: ${key} unavailable (fence ${f}); it stays unknown`);
                return 'unavailable';
            }
            finally {
                hb.stop();
            }
        }
        catch (e) {
            if (e instanceof errors_js_1.NotFound && fence === null) {
                this.log.info(`reconciler: ${key} skipped (collected meanwhile)`);
                return 'skipped';
            }
            this.log.error(`reconciler: ${key}${fence === null ? '' : ` (fence ${fence})`} failed; it stays as it was`, e);
            return 'errors';
        }
    }
    /** A middleware hook's committed response, as the middleware stores one. */
    storedResponse(found, entry) {
        const r = (0, mwcore_js_1.foundResponse)(found.response);
        const names = [...new Set([...mwcore_js_1.DEFAULT_STORED_HEADERS, ...(entry.storedHeaders ?? []).map((h) => h.toLowerCase())])];
        const { result, responseSha256 } = (0, mwcore_js_1.encodeResponse)(r.status, r.headers, r.body, names, entry.maxStoredBody ?? mwcore_js_1.DEFAULT_MAX_STORED_BODY);
        return { status: r.status >= 500 ? 'failed' : 'completed', result, responseSha256 };
    }
    /** Whether the background mode runs: from start() until its loop ended
     * (after stop(), once the sweep under way wound down). */
    get running() {
        return this.loop !== null;
    }
    /** Sweeps now and then every `intervalMs` after each sweep ends, until
     * stop(). Throws while a loop runs, also one that stop() gave up waiting
     * for and that is still winding down. */
    start(intervalMs) {
        if (!(intervalMs > 0))
            throw new RangeError('start(intervalMs): intervalMs must be positive');
        if (this.loop)
            throw new Error('the reconciler is already running (a loop stopped with a timeout may still be winding down)');
        const loop = { stopping: new AbortController(), abort: new AbortController(), done: Promise.resolve() };
        const run = async () => {
            while (!loop.stopping.signal.aborted) {
                try {
                    await this.sweepUntil(loop.abort.signal);
                }
                catch (e) {
                    this.log.error('reconciler: sweep failed', e);
                }
                await pause(intervalMs, loop.stopping.signal);
            }
        };
        this.loop = loop;
        loop.done = run().finally(() => {
            if (this.loop === loop)
                this.loop = null;
        });
    }
    /** Stops the background mode. Resolves true once the sweep under way (if
     * any) ended, or, after `timeoutMs`, false: that sweep is then abandoned
     * (a hook still running is handed back with reconcile(unavailable) in the
     * background and counted under `errors`) and start() keeps refusing until
     * it wound down. Without a timeout, waits for the sweep to end. */
    async stop(timeoutMs) {
        const loop = this.loop;
        if (!loop)
            return true;
        loop.stopping.abort();
        if (timeoutMs === undefined) {
            await loop.done;
            return true;
        }
        let timer;
        const timedOut = new Promise((resolve) => (timer = setTimeout(() => resolve(false), Math.max(0, timeoutMs))));
        const ended = await Promise.race([loop.done.then(() => true), timedOut]);
        clearTimeout(timer);
        if (!ended) {
            loop.abort.abort(new Error('stop(): the sweep was abandoned at its timeout'));
            this.log.warn(`reconciler: stop(${timeoutMs}) gave up waiting for the sweep under way; it is abandoned`);
        }
        return ended;
    }
}
exports.Reconciler = Reconciler;
