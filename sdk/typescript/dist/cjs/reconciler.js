"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.Reconciler = void 0;
const worker_js_1 = require("./worker.js");
const zero = () => ({ seen: 0, committed: 0, not_committed: 0, unavailable: 0, skipped: 0, errors: 0 });
const defaultLogger = { info: () => { }, warn: (m) => console.warn(m), error: (m, e) => console.error(m, e ?? '') };
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
    pageSize;
    worker;
    serializer;
    timer = null;
    current = null;
    stopped = true;
    constructor(client, options) {
        if (!client)
            throw new TypeError('new Reconciler(client, { hooks }) needs a settle Client');
        if (!options || !options.hooks || typeof options.hooks !== 'object')
            throw new TypeError('new Reconciler(client, { hooks: { [keyPrefix]: hook } })');
        for (const [p, h] of Object.entries(options.hooks)) {
            if (typeof h !== 'function')
                throw new TypeError(`the hook of prefix ${JSON.stringify(p)} must be a function (key, fence) => finding`);
        }
        this.client = client;
        this.hooks = options.hooks;
        this.prefixes = Object.keys(options.hooks);
        this.log = options.logger ?? defaultLogger;
        this.leaseMs = options.leaseMs ?? 30_000;
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
    async sweep() {
        const c = zero();
        for (const prefix of this.prefixes) {
            const hook = this.hooks[prefix];
            let after;
            do {
                let page;
                try {
                    page = await (0, worker_js_1.retrying)(() => this.client.list({ reconcileRequired: true, keyPrefix: prefix, limit: this.pageSize, ...(after !== undefined ? { after } : {}) }), new worker_js_1.Deadline(this.leaseMs), 'list');
                }
                catch (e) {
                    c.errors++;
                    this.log.error(`reconciler: listing the records of prefix ${JSON.stringify(prefix)} failed`, e);
                    break;
                }
                for (const op of page.operations) {
                    if (this.owner(op.key) !== prefix)
                        continue; // a longer prefix's hook owns it
                    c.seen++;
                    c[await this.one(op.key, hook)]++;
                }
                after = page.next ?? undefined;
            } while (after !== undefined);
        }
        for (const k of Object.keys(c))
            this.counts[k] += c[k];
        this.sweeps++;
        this.lastSweep = c;
        return c;
    }
    async one(key, hook) {
        const { client, leaseMs } = this;
        const dl = () => new worker_js_1.Deadline(leaseMs);
        let fence = null;
        try {
            const rec = await (0, worker_js_1.retrying)(() => client.get(key), dl(), 'get');
            if (!rec.reconcileRequired) {
                this.log.info(`reconciler: ${key} skipped (resolved meanwhile)`);
                return 'skipped';
            }
            const { fingerprint, principal, scopes } = rec.reservation;
            const generation = await (0, worker_js_1.retrying)(() => client.principal(principal), dl(), 'principal');
            const binding = { principal, scopes, generation };
            const dec = await (0, worker_js_1.retrying)(() => client.claim(key, fingerprint, binding, { marksDispatch: true, leaseMs, worker: this.worker }), dl(), 'claim');
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
            const stop = (0, worker_js_1.startHeartbeat)(client, key, f, leaseMs, new AbortController());
            try {
                let finding;
                try {
                    finding = await hook(key, f);
                }
                catch (e) {
                    await (0, worker_js_1.retrying)(() => client.reconcile(key, f, 'unavailable'), dl(), 'reconcile');
                    this.log.error(`reconciler: the hook failed for ${key} (fence ${f}); it stays unknown`, e);
                    return 'errors';
                }
                if (typeof finding === 'object' && finding !== null) {
                    let outcome;
                    try {
                        outcome = (0, worker_js_1.doneToOutcome)(finding, this.serializer);
                    }
                    catch (e) {
                        await (0, worker_js_1.retrying)(() => client.reconcile(key, f, 'unavailable'), dl(), 'reconcile');
                        this.log.error(`reconciler: the hook's result for ${key} cannot be stored; it stays unknown`, e);
                        return 'errors';
                    }
                    await (0, worker_js_1.retrying)(() => client.reconcile(key, f, 'committed', { fingerprint, binding, outcome }), dl(), 'reconcile');
                    this.log.info(`reconciler: ${key} committed (fence ${f}, ${outcome.status})`);
                    return 'committed';
                }
                if (finding === 'not_committed') {
                    const g = (await (0, worker_js_1.retrying)(() => client.reconcile(key, f, 'not_committed'), dl(), 'reconcile'));
                    // The execute lease it is handed never dispatched: the next claim executes.
                    await (0, worker_js_1.retrying)(() => client.release(key, g.fence, 'not_dispatched'), dl(), 'release');
                    this.log.info(`reconciler: ${key} not_committed (fence ${f}); the next run executes`);
                    return 'not_committed';
                }
                await (0, worker_js_1.retrying)(() => client.reconcile(key, f, 'unavailable'), dl(), 'reconcile');
                this.log.info(`reconciler: ${key} unavailable (fence ${f}); it stays unknown`);
                return 'unavailable';
            }
            finally {
                stop();
            }
        }
        catch (e) {
            this.log.error(`reconciler: ${key}${fence === null ? '' : ` (fence ${fence})`} failed; it stays as it was`, e);
            return 'errors';
        }
    }
    /** Whether the background mode runs. */
    get running() {
        return !this.stopped;
    }
    /** Sweeps now and then every `intervalMs` after each sweep ends, until stop(). */
    start(intervalMs) {
        if (!(intervalMs > 0))
            throw new RangeError('start(intervalMs): intervalMs must be positive');
        if (!this.stopped)
            throw new Error('the reconciler is already running');
        this.stopped = false;
        const tick = () => {
            this.timer = null;
            this.current = this.sweep()
                .catch((e) => this.log.error('reconciler: sweep failed', e))
                .finally(() => {
                this.current = null;
                if (!this.stopped)
                    this.timer = setTimeout(tick, intervalMs);
            });
        };
        tick();
    }
    /** Stops the background mode; resolves once the sweep under way (if any) ended. */
    async stop() {
        this.stopped = true;
        if (this.timer)
            clearTimeout(this.timer);
        this.timer = null;
        await this.current;
    }
}
exports.Reconciler = Reconciler;
