"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.Client = exports.newClaimId = void 0;
exports.encodeSegment = seg;
// The typed HTTP client of SPEC §7, on the built-in fetch (on node:https with
// a custom CA, tls.ts); every request carries the caller's W3C trace context
// when @opentelemetry/api is installed (trace.ts).
const errors_js_1 = require("./errors.js");
const tls_js_1 = require("./tls.js");
const trace_js_1 = require("./trace.js");
const types_js_1 = require("./types.js");
const worker_js_1 = require("./worker.js");
function query(params) {
    const q = [];
    const add = (name, v) => q.push(`${name}=${encodeURIComponent(v)}`);
    if (params.status !== undefined)
        add('status', typeof params.status === 'string' ? params.status : params.status.join(','));
    for (const [name, v] of [
        ['reconcile_required', params.reconcileRequired],
        ['disputed', params.disputed],
        ['stuck', params.stuck],
        ['quarantined', params.quarantined],
    ]) {
        if (v !== undefined)
            add(name, v ? 'true' : 'false');
    }
    if (params.keyPrefix !== undefined)
        add('key_prefix', params.keyPrefix);
    if (params.order !== undefined)
        add('order', params.order);
    if (params.limit !== undefined)
        add('limit', String(params.limit));
    if (params.after !== undefined && params.after !== null)
        add('after', String(params.after));
    return q.length ? '?' + q.join('&') : '';
}
var jcs_js_1 = require("./jcs.js");
Object.defineProperty(exports, "newClaimId", { enumerable: true, get: function () { return jcs_js_1.newClaimId; } });
/** Every byte but the unreserved ones percent-encoded (SPEC §7 path segments). */
function seg(s) {
    if (typeof s !== 'string')
        throw new TypeError('a path segment must be a string');
    return encodeURIComponent(s).replace(/[!'()*]/g, (c) => '%' + c.charCodeAt(0).toString(16).toUpperCase());
}
/** SPEC §2: fences and generations are integers in [0, 2^53 − 1]. */
function uint(name, v) {
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) {
        throw new RangeError(`${name} must be an integer in [0, 2^53 - 1], got ${String(v)}`);
    }
    return v;
}
function bindingToWire(b) {
    if (!b || typeof b.principal !== 'string')
        throw new TypeError('binding.principal must be a string');
    return { principal: b.principal, scopes: [...(b.scopes ?? [])], generation: uint('binding.generation', b.generation ?? 0) };
}
class Client {
    url;
    token;
    timeoutMs;
    /** undefined until the fetch trusting `ca` is loaded (`tlsFetch`). */
    fetchImpl;
    tlsFetch;
    extraHeaders;
    constructor(options) {
        if (!options || typeof options.url !== 'string')
            throw new TypeError('new Client({ url, token? })');
        this.url = options.url.replace(/\/+$/, '');
        this.token = options.token;
        this.timeoutMs = options.timeoutMs ?? 10_000;
        this.extraHeaders = options.headers ?? {};
        const ca = options.ca;
        if (ca !== undefined) {
            (0, tls_js_1.checkCA)(ca);
            if (options.fetch)
                throw new TypeError('new Client({ ca, fetch }): give one of them (with your own fetch, set its TLS trust there)');
        }
        if (ca !== undefined && /^https:/i.test(this.url)) {
            let loading;
            this.tlsFetch = () => (loading ??= (0, tls_js_1.fetchTrusting)(ca).then((f) => (this.fetchImpl = f)));
        }
        else {
            this.fetchImpl = options.fetch ?? fetch;
        }
    }
    async send(method, path, body, raw = false) {
        const headers = {
            accept: 'application/json',
            'user-agent': 'settle-client-typescript/0.2',
            ...this.extraHeaders,
        };
        if (body !== undefined)
            headers['content-type'] = 'application/json';
        if (this.token)
            headers.authorization = `Bearer ${this.token}`;
        const traced = (0, trace_js_1.injectTraceContext)(headers);
        if (traced)
            await traced;
        const { status, text, retryAfter } = await this.exchange(method, path, headers, body === undefined ? undefined : JSON.stringify(body));
        if (status === 200)
            return raw ? text : JSON.parse(text);
        let parsed = text;
        try {
            parsed = JSON.parse(text);
        }
        catch {
            // a non-JSON error (a proxy's HTML page): kept as text
        }
        const ra = retryAfter;
        throw (0, errors_js_1.problemError)(status, parsed, ra !== null && !Number.isNaN(Number(ra)) ? Number(ra) : null);
    }
    /** One request and its answer: the status, the body's text and
     * `Retry-After`; `TransportError` when no answer arrived. What every
     * call goes through (`@settle/local` answers it in process). */
    async exchange(method, path, headers, body) {
        const fetchImpl = this.fetchImpl ?? (await this.tlsFetch());
        try {
            const resp = await fetchImpl(this.url + path, {
                method,
                headers,
                body,
                signal: AbortSignal.timeout(this.timeoutMs),
            });
            return { status: resp.status, text: await resp.text(), retryAfter: resp.headers.get('retry-after') };
        }
        catch (e) {
            // fetch's own message is "fetch failed": the reason (refused, reset, a
            // certificate not trusted) is its cause's.
            const cause = e?.cause?.message;
            const why = e?.message ?? String(e);
            throw new errors_js_1.TransportError(`${method} ${path}: ${why}${typeof cause === 'string' && cause ? ` (${cause})` : ''}`, { cause: e });
        }
    }
    /** `R`: the type of a replay's stored result (not checked: the ledger holds JSON). */
    async claim(key, fingerprint, binding, options = {}) {
        const body = { fingerprint, binding: bindingToWire(binding) };
        if (options.leaseMs !== undefined)
            body.lease_ms = options.leaseMs;
        if (options.worker !== undefined)
            body.worker = options.worker;
        if (options.marksDispatch)
            body.marks_dispatch = true;
        if (options.retentionS !== undefined)
            body.retention_s = options.retentionS;
        if (options.claimId !== undefined)
            body.claim_id = options.claimId;
        return (0, types_js_1.claimFromWire)(await this.send('POST', `/v1/operations/${seg(key)}/claim`, body));
    }
    async heartbeat(key, fence, leaseMs) {
        const body = { fence: uint('fence', fence) };
        if (leaseMs !== undefined)
            body.lease_ms = leaseMs;
        const d = await this.send('POST', `/v1/operations/${seg(key)}/heartbeat`, body);
        return { fence: d.fence, leaseExpiresAt: d.lease_expires_at };
    }
    async dispatch(key, fence) {
        const d = await this.send('POST', `/v1/operations/${seg(key)}/dispatch`, { fence: uint('fence', fence) });
        return { fence: d.fence, leaseExpiresAt: d.lease_expires_at, dispatched: d.dispatched };
    }
    async settle(key, fence, fingerprint, binding, outcome) {
        const d = await this.send('POST', `/v1/operations/${seg(key)}/settle`, {
            fence: uint('fence', fence),
            fingerprint,
            binding: bindingToWire(binding),
            outcome: (0, types_js_1.outcomeToWire)(outcome),
        });
        return (0, types_js_1.receiptFromWire)(d.receipt);
    }
    async release(key, fence, reason = 'not_dispatched', options = {}) {
        const body = { fence: uint('fence', fence) };
        if (reason !== null)
            body.reason = reason;
        if (options.forget)
            body.forget = true;
        const d = await this.send('POST', `/v1/operations/${seg(key)}/release`, body);
        return { fence: d.fence, released: d.released };
    }
    async reconcile(key, fence, finding, options = {}) {
        const body = { fence: uint('fence', fence), finding };
        if (options.fingerprint !== undefined)
            body.fingerprint = options.fingerprint;
        if (options.binding !== undefined)
            body.binding = bindingToWire(options.binding);
        if (options.outcome !== undefined)
            body.outcome = (0, types_js_1.outcomeToWire)(options.outcome);
        const d = await this.send('POST', `/v1/operations/${seg(key)}/reconcile`, body);
        if (d.receipt)
            return (0, types_js_1.receiptFromWire)(d.receipt);
        if (d.decision)
            return (0, types_js_1.claimFromWire)(d);
        return { fence: d.fence, released: d.released };
    }
    /** `R`: the type of the stored result (not checked: the ledger holds JSON). */
    async get(key) {
        return (0, types_js_1.recordFromWire)(await this.send('GET', `/v1/operations/${seg(key)}`));
    }
    /** SPEC §9: one page of the tenant's records, filtered; pass `next` as
     * `after` (with the same filters) for the next page, until it is null. */
    async list(params = {}) {
        const d = await this.send('GET', `/v1/operations${query(params)}`);
        return { operations: d.operations.map(types_js_1.summaryFromWire), next: d.next === null || d.next === undefined ? null : String(d.next) };
    }
    /** SPEC §9: the tenant's counts by status and flag. */
    async stats() {
        return (0, types_js_1.statsFromWire)(await this.send('GET', '/v1/stats'));
    }
    /** SPEC §10: several calls in one request, applied in order (not
     * atomically); one result per call, each what the single call would have
     * answered. */
    async batch(calls) {
        const d = await this.send('POST', '/v1/batch', { calls });
        return d.results.map((r) => ({
            status: r.status,
            body: r.body,
            error: r.status === 200 ? null : (0, errors_js_1.problemError)(r.status, r.body),
        }));
    }
    /** SPEC §7: the principal's current generation (0 for one never seen). */
    async principal(principal) {
        const d = await this.send('GET', `/v1/principals/${seg(principal)}`);
        return uint('generation', d.generation);
    }
    async revoke(principal) {
        const d = await this.send('POST', `/v1/principals/${seg(principal)}/revoke`, {});
        return { principal: d.principal, generation: d.generation };
    }
    async warn(task, cls, detail) {
        const body = detail === undefined ? {} : { detail };
        return (0, types_js_1.warningFromWire)(await this.send('POST', `/v1/tasks/${seg(task)}/warnings/${seg(cls)}`, body));
    }
    async warnings(task) {
        const d = await this.send('GET', `/v1/tasks/${seg(task)}/warnings`);
        return d.warnings.map(types_js_1.warningFromWire);
    }
    async health() {
        return this.send('GET', '/healthz');
    }
    async ready() {
        return this.send('GET', '/readyz');
    }
    async metrics() {
        return this.send('GET', '/metrics', undefined, true);
    }
    async openapi() {
        return this.send('GET', '/openapi.json');
    }
    /** SPEC §11: run `effect` at most once for `key` (see runOnce). */
    runOnce(key, request, effect, options) {
        return (0, worker_js_1.runOnce)(this, key, request, effect, options);
    }
}
exports.Client = Client;
