import { BindingMismatch, FingerprintMismatch, InvalidRequest, ReceiptRequired } from './errors.js';
import * as mw from './mwcore.js';
import { Deadline, retrying, startHeartbeat } from './worker.js';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const STATE = Symbol.for('settle.idempotency');
const RETRYABLE = Symbol.for('settle.idempotency.retryable');
/** Mark the response as saying nothing happened: not stored, the lease is
 * released with not_committed, and a retry runs the handler again. */
export function markRetryable(res) {
    res[RETRYABLE] = true;
}
function headerValues(req, name) {
    const out = [];
    const raw = req.rawHeaders;
    for (let i = 0; i + 1 < raw.length; i += 2)
        if (raw[i].toLowerCase() === name)
            out.push(raw[i + 1]);
    return out;
}
function pathOf(req) {
    const u = req.originalUrl ?? req.url ?? '/';
    const q = u.indexOf('?');
    return q === -1 ? u : u.slice(0, q);
}
function targetOf(req) {
    const u = req.originalUrl ?? req.url ?? '/';
    return u.endsWith('?') ? u.slice(0, -1) : u; // "/p?" and "/p" are one target, as in ASGI
}
function checkGeneration(g) {
    if (typeof g !== 'number' || !Number.isSafeInteger(g) || g < 0) {
        throw new RangeError(`a principal's generation must be an integer in [0, 2^53 - 1], got ${String(g)}`);
    }
    return g;
}
/** The principal and generation an extractor found, or null (no identity). */
function principalParts(found) {
    if (found === null || found === undefined)
        return null;
    if (typeof found === 'string')
        return { principal: found, generation: 0 };
    if (typeof found === 'object' && typeof found.principal === 'string') {
        return { principal: found.principal, generation: found.generation === undefined ? 0 : checkGeneration(found.generation) };
    }
    throw new TypeError(`the principal extractor must return a string, { principal, generation? }, null or undefined, not ${String(found)}`);
}
/** The `principal` of an application with one caller: every request is
 * `name` (at `generation`; move it forward after revoking `name`). */
export function fixedPrincipal(name, generation = 0) {
    if (typeof name !== 'string')
        throw new TypeError('fixedPrincipal(name): the name must be a string');
    const found = { principal: name, generation: checkGeneration(generation) };
    return () => found;
}
/** The `principal` from the authenticated identity that an earlier
 * middleware put in `req.user` (the Passport/Express convention): no
 * `req.user` → null (401 `idempotency_principal_missing`). The principal is
 * `pick(user)` when given (a string, `{ principal, generation? }` or null),
 * else `String(user.id ?? user.username)` (null when it has neither). It
 * must name the account, never a token. */
export function authenticatedPrincipal(pick) {
    if (pick !== undefined && typeof pick !== 'function')
        throw new TypeError('authenticatedPrincipal(pick?): pick must be a function of req.user');
    return (req) => {
        const user = req.user;
        if (user === null || user === undefined)
            return null;
        if (pick)
            return pick(user);
        if (typeof user !== 'object')
            return null;
        const u = user;
        const id = u.id ?? u.username;
        return id === null || id === undefined ? null : String(id);
    };
}
const silent = { info: () => { }, warn: (m) => console.warn(m), error: (m, e) => console.error(m, e ?? '') };
export function idempotency(options) {
    const client = options.client;
    if (!client)
        throw new TypeError('idempotency({ client }) needs a settle Client');
    const extractPrincipal = options.principal;
    if (typeof extractPrincipal !== 'function') {
        throw new TypeError("idempotency({ principal }) is required: a function of the request that names the caller's account " +
            '(never a token or a header value), e.g. principal: fixedPrincipal("acct-1") for an application with one caller, ' +
            'or principal: authenticatedPrincipal() for req.user');
    }
    const unavailableRetryAfterS = options.unavailableRetryAfterS ?? 1;
    const namespace = options.namespace ?? 'default';
    const methods = new Set((options.methods ?? ['POST', 'PATCH']).map((m) => m.toUpperCase()));
    const stored = [...new Set([...mw.DEFAULT_STORED_HEADERS, ...(options.storedHeaders ?? []).map((h) => h.toLowerCase())])];
    const fpHeaders = (options.fingerprintHeaders ?? []).map((h) => h.toLowerCase());
    // Checked here: a bad combination throws mw.MiddlewareConfigError naming the option.
    const fpOptions = mw.fingerprintOptions({ canonicalJson: options.canonicalJson, fields: options.fields, exclude: options.exclude });
    const maxStoredBody = options.maxStoredBody ?? mw.DEFAULT_MAX_STORED_BODY;
    const maxRequestBody = options.maxRequestBody ?? 1024 * 1024;
    const leaseMs = options.leaseMs ?? 30_000;
    const log = options.logger ?? silent;
    const onError = options.onError ?? ((err) => console.error('idempotency: handler failed', err));
    const checkWait = (w) => {
        if (w === undefined)
            return 0;
        if (typeof w !== 'number' || !Number.isFinite(w) || w < 0)
            throw new RangeError(`the wait option is seconds >= 0, got ${String(w)}`);
        return w;
    };
    const defaultPolicy = {
        required: true,
        failOpen: options.failOpen ?? false,
        timeoutMs: options.timeoutMs ?? null,
        wait: checkWait(options.wait),
    };
    const stats = {};
    const count = (k) => {
        stats[k] = (stats[k] ?? 0) + 1;
    };
    function policyOf(method, path) {
        if (options.routes) {
            const p = options.routes(method, path);
            if (!p)
                return null;
            return {
                required: p.required ?? true,
                failOpen: p.failOpen ?? false,
                timeoutMs: p.timeoutMs ?? defaultPolicy.timeoutMs ?? null,
                wait: p.wait === undefined ? (defaultPolicy.wait ?? 0) : checkWait(p.wait),
            };
        }
        return methods.has(method.toUpperCase()) ? defaultPolicy : null;
    }
    function send(res, status, headers, body) {
        for (const n of res.getHeaderNames())
            res.removeHeader(n);
        res.statusCode = status;
        for (const [n, v] of headers)
            res.setHeader(n, v);
        res.setHeader('content-length', String(body.length));
        res.end(body);
    }
    function problem(res, status, code, detail, extra = []) {
        send(res, status, [['content-type', 'application/problem+json'], ...extra], mw.problemBody(status, code, detail));
    }
    function refuse(res, status, code, detail, key) {
        count(code);
        log.info(`idempotency: ${code} for key ${key}`);
        problem(res, status, code, detail);
    }
    /** The whole request body (the fingerprint needs it), put back into the
     * request stream once read: the handler and any body parser after the
     * middleware read the request exactly as without it. */
    async function readBody(req) {
        if (req.readableEnded || req._body) {
            // A body parser ran first: use the raw bytes it kept, else its result.
            if (Buffer.isBuffer(req.rawBody))
                return req.rawBody;
            return Buffer.from(req.body === undefined ? '' : typeof req.body === 'string' ? req.body : JSON.stringify(req.body));
        }
        const encoding = req.readableEncoding; // set by an earlier setEncoding: read() gives strings
        const parts = [];
        const texts = [];
        let size = 0;
        await new Promise((resolve, reject) => {
            const cleanup = () => {
                req.off('readable', onReadable);
                req.off('error', onError);
                req.off('close', onClose);
            };
            const onError = (e) => {
                cleanup();
                reject(e);
            };
            const onClose = () => onError(new Error('the request was aborted before its body arrived'));
            // Paused mode: read() what arrives, and stop before the end is read
            // (req.complete: the parser has pushed the end). The stream's 'end' is
            // not emitted as long as data is put back before the next tick.
            const onReadable = () => {
                while (req.readableLength > 0) {
                    const chunk = req.read();
                    if (chunk === null)
                        break;
                    const b = typeof chunk === 'string' ? Buffer.from(chunk, encoding ?? 'utf8') : chunk;
                    size += b.length;
                    if (size <= maxRequestBody) {
                        parts.push(b);
                        if (typeof chunk === 'string')
                            texts.push(chunk);
                    }
                }
                if (!req.complete || req.readableLength > 0)
                    return;
                cleanup();
                if (size <= maxRequestBody && size > 0) {
                    if (encoding)
                        req.unshift(texts.join(''), encoding);
                    else
                        req.unshift(Buffer.concat(parts));
                }
                resolve();
            };
            req.on('error', onError);
            req.on('close', onClose);
            if (req.complete && req.readableLength === 0) {
                cleanup();
                resolve(); // no body, or it was all read before: nothing to put back
            }
            else {
                req.on('readable', onReadable);
            }
        });
        // Removing the 'readable' listener hands the stream back (no reading
        // mode) on the next tick: before anything downstream attaches.
        await new Promise((r) => process.nextTick(r));
        if (size > maxRequestBody)
            return 'too_large';
        return Buffer.concat(parts);
    }
    async function handle(req, res, next) {
        const method = (req.method ?? 'GET').toUpperCase();
        const policy = policyOf(method, pathOf(req));
        if (!policy)
            return next();
        let key;
        try {
            key = mw.parseIdempotencyKey(headerValues(req, 'idempotency-key'));
        }
        catch (e) {
            const k = e;
            return refuse(res, 400, k.code, k.message, null);
        }
        if (key === null) {
            if (!policy.required)
                return next();
            return refuse(res, 400, 'idempotency_key_missing', 'this route requires an Idempotency-Key header', null);
        }
        const who = principalParts(await extractPrincipal(req));
        if (who === null)
            return refuse(res, 401, 'idempotency_principal_missing', mw.PRINCIPAL_MISSING_DETAIL, key);
        const body = await readBody(req);
        if (body === 'too_large')
            return refuse(res, 413, 'payload_too_large', 'the request body is over the idempotency limit', key);
        const fp = mw.requestFingerprint(method, targetOf(req), req.headers['content-type'] ?? '', body, fpHeaders.map((h) => [h, headerValues(req, h).join(', ')]), fpOptions);
        const { principal, generation } = who;
        const lkey = mw.ledgerKey(namespace, principal, key);
        const binding = { principal: mw.bindingPrincipal(principal), scopes: [], generation };
        let dec;
        // A duplicate of a request still running waits up to policy.wait
        // seconds for its outcome, claiming again after the ledger's hint.
        const waiting = new Deadline((policy.wait ?? 0) * 1000);
        for (;;) {
            try {
                dec = await client.claim(lkey, fp, binding, {
                    leaseMs,
                    worker: mw.workerLabel(key, principal),
                    marksDispatch: true,
                    ...(options.retentionS !== undefined ? { retentionS: options.retentionS } : {}),
                });
            }
            catch (e) {
                if (e instanceof FingerprintMismatch || e instanceof BindingMismatch) {
                    return refuse(res, 422, 'idempotency_key_reused', 'this Idempotency-Key was used for another request', key);
                }
                return ledgerFailed(res, next, policy, key, e, 'claim');
            }
            if (dec.decision !== 'in_flight' || waiting.left() <= 0)
                break;
            await sleep(Math.min(dec.retryAfterMs, waiting.left()));
        }
        if (dec.decision === 'replay')
            return replay(res, key, dec.outcome.result);
        if (dec.decision === 'in_flight') {
            count('request_in_progress');
            log.info(`idempotency: key ${key} in progress`);
            return problem(res, 409, 'request_in_progress', 'a request with this Idempotency-Key is still being processed', [
                ['retry-after', inProgressRetryAfter(dec)],
            ]);
        }
        let grant = dec;
        if (grant.decision === 'reconcile') {
            const g = await reconcile(req, res, lkey, grant, key, fp, binding, { idempotencyKey: key, principal, body });
            if (g === 'answered')
                return;
            if (!g)
                return refuse(res, 409, 'outcome_unknown', 'an earlier request with this Idempotency-Key failed with an unknown outcome', key);
            grant = g;
        }
        // A dispatch whose answer was lost is retried under the same fence (the
        // ledger answers a repeated dispatch alike), for half the lease: the
        // rest is left for handing the lease back.
        const fence = grant.fence;
        const lease = new Deadline(leaseMs);
        try {
            await retrying(() => client.dispatch(lkey, fence), new Deadline(leaseMs / 2), 'dispatch');
        }
        catch (e) {
            await releaseUndispatched(lkey, fence, key, lease);
            return ledgerFailed(res, next, policy, key, e, 'dispatch');
        }
        await execute(req, res, next, policy, key, lkey, fp, binding, grant.fence);
    }
    /** Hands back a lease whose handler never ran, after a dispatch that
     * failed: `not_dispatched`, or, when the ledger had recorded the dispatch
     * after all (its answer was lost: `receipt_required`), `not_committed`
     * (true: the handler did not run). */
    async function releaseUndispatched(lkey, fence, key, lease) {
        try {
            await retrying(() => client.release(lkey, fence, 'not_dispatched'), lease, 'release');
            return;
        }
        catch (e) {
            if (!(e instanceof ReceiptRequired)) {
                // The lease lapses; with no dispatch recorded nothing is flagged.
                log.warn(`idempotency: release(not_dispatched) of key ${key} failed: ${String(e)}`);
                return;
            }
        }
        try {
            await retrying(() => client.release(lkey, fence, 'not_committed'), lease, 'release');
        }
        catch (e) {
            log.error(`idempotency: the dispatch of key ${key} was recorded but the handler did not run, and release(not_committed) failed: ` +
                'the record becomes unknown when its lease lapses', e);
        }
    }
    /** `Retry-After` of request_in_progress: the time the running lease has
     * left, in whole seconds, at least 1 and at least the ledger's hint. */
    function inProgressRetryAfter(d) {
        return String(mw.inProgressRetryAfterS(d.retryAfterMs, d.leaseExpiresAt));
    }
    /** SPEC §8: a retry found the record `unknown` (a reconcile lease).
     * Returns the execute grant under the same fence (not_committed: run the
     * handler), 'answered' (the found response was settled and replayed), or
     * null (409 `outcome_unknown`: the record stays unknown). */
    async function reconcile(req, res, lkey, grant, key, fp, binding, info) {
        const fence = grant.fence;
        const lease = new Deadline(leaseMs);
        let finding = 'unavailable';
        if (options.reconcile) {
            const stopHeartbeat = startHeartbeat(client, lkey, fence, leaseMs, new AbortController());
            try {
                finding = await options.reconcile(lkey, fence, req, info);
            }
            catch (e) {
                log.error(`idempotency: reconcile hook failed for key ${key}`, e);
                finding = 'unavailable';
            }
            finally {
                stopHeartbeat();
            }
        }
        let found = null;
        if (typeof finding === 'object' && finding !== null && finding.finding === 'committed') {
            try {
                found = foundResponse(finding.response);
            }
            catch (e) {
                log.error(`idempotency: the reconcile hook of key ${key} found an invalid response; taken as unavailable`, e);
                finding = 'unavailable';
            }
        }
        else if (finding !== 'not_committed' && finding !== 'unavailable') {
            log.error(`idempotency: the reconcile hook of key ${key} returned ${JSON.stringify(finding)}; taken as unavailable`);
            finding = 'unavailable';
        }
        try {
            if (found) {
                const { result, responseSha256 } = mw.encodeResponse(found.status, found.headers, found.body, stored_(), maxStoredBody);
                const status = found.status;
                await retrying(() => client.reconcile(lkey, fence, 'committed', { fingerprint: fp, binding, outcome: { status: status >= 500 ? 'failed' : 'completed', result, responseSha256 } }), lease, 'reconcile');
                count('reconciled');
                log.info(`idempotency: key ${key} reconciled: the hook found its response (${status})`);
                replay(res, key, result);
                return 'answered';
            }
            if (finding === 'not_committed') {
                const ans = await retrying(() => client.reconcile(lkey, fence, 'not_committed'), lease, 'reconcile');
                if ('decision' in ans) {
                    log.info(`idempotency: key ${key} reconciled: not committed, the handler runs (fence ${fence})`);
                    return ans;
                }
                return null;
            }
            await retrying(() => client.reconcile(lkey, fence, 'unavailable'), lease, 'reconcile');
        }
        catch (e) {
            // The reconcile lease lapses: the record stays unknown.
            log.warn(`idempotency: reconcile of key ${key} failed: ${String(e)}`);
        }
        return null;
    }
    /** A hook's response as status, headers and body bytes. */
    function foundResponse(r) {
        if (!r || typeof r !== 'object' || !Number.isInteger(r.status) || r.status < 100 || r.status > 599) {
            throw new TypeError('a committed finding needs response: { status (100-599), headers?, body? }');
        }
        const headers = (Array.isArray(r.headers) ? r.headers : Object.entries(r.headers ?? {})).map(([n, v]) => [String(n).toLowerCase(), String(v)]);
        let body;
        if (r.body === undefined || r.body === null)
            body = Buffer.alloc(0);
        else if (typeof r.body === 'string')
            body = Buffer.from(r.body, 'utf8');
        else if (r.body instanceof Uint8Array)
            body = Buffer.from(r.body);
        else {
            body = Buffer.from(JSON.stringify(r.body), 'utf8');
            if (!headers.some(([n]) => n === 'content-type'))
                headers.push(['content-type', 'application/json']);
        }
        return { status: r.status, headers, body };
    }
    async function execute(req, res, next, policy, key, lkey, fp, binding, fence) {
        count('executed');
        const chunks = [];
        const orig = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders };
        let settleResult;
        const done = new Promise((resolve) => (settleResult = resolve));
        let over = false;
        const finish = (r) => {
            if (over)
                return;
            over = true;
            state.active = false;
            settleResult(r);
        };
        const state = { active: true, fail: (err) => finish({ kind: 'escaped', err, timeout: false }) };
        req[STATE] = state;
        const toBuf = (chunk, encoding) => {
            if (chunk === undefined || chunk === null || typeof chunk === 'function')
                return null;
            if (Buffer.isBuffer(chunk))
                return chunk;
            if (chunk instanceof Uint8Array)
                return Buffer.from(chunk);
            return Buffer.from(String(chunk), typeof encoding === 'string' ? encoding : 'utf8');
        };
        const r = res;
        // Capture: nothing reaches the client until the outcome is settled.
        r.writeHead = function (status, a, b) {
            if (over)
                return res;
            res.statusCode = status;
            if (typeof a === 'string')
                res.statusMessage = a;
            const h = typeof a === 'object' && a !== null ? a : b;
            if (Array.isArray(h)) {
                for (let i = 0; i + 1 < h.length; i += 2)
                    res.setHeader(String(h[i]), h[i + 1]);
            }
            else if (h && typeof h === 'object') {
                for (const [n, v] of Object.entries(h))
                    res.setHeader(n, v);
            }
            return res;
        };
        r.write = function (chunk, encoding, cb) {
            if (!over) {
                const buf = toBuf(chunk, encoding);
                if (buf)
                    chunks.push(buf);
            }
            const callback = typeof encoding === 'function' ? encoding : cb;
            if (typeof callback === 'function')
                process.nextTick(callback);
            return true;
        };
        r.end = function (chunk, encoding, cb) {
            if (!over) {
                const buf = toBuf(chunk, encoding);
                if (buf)
                    chunks.push(buf);
                finish({ kind: 'response' });
            }
            const callback = [chunk, encoding, cb].find((x) => typeof x === 'function');
            if (typeof callback === 'function')
                process.nextTick(callback);
            return res;
        };
        r.flushHeaders = function () { };
        const ac = new AbortController();
        const stopHeartbeat = startHeartbeat(client, lkey, fence, leaseMs, ac);
        let timer;
        if (policy.timeoutMs != null) {
            timer = setTimeout(() => finish({ kind: 'escaped', err: new Error(`handler timed out after ${policy.timeoutMs} ms`), timeout: true }), policy.timeoutMs);
        }
        try {
            next();
        }
        catch (e) {
            finish({ kind: 'escaped', err: e, timeout: false });
        }
        const result = await done;
        if (timer)
            clearTimeout(timer);
        stopHeartbeat();
        const restore = () => {
            // Later writes of an abandoned handler go nowhere; ours use the originals.
            res.writeHead = orig.writeHead;
            res.write = orig.write;
            res.end = orig.end;
            res.flushHeaders = orig.flushHeaders;
        };
        if (result.kind === 'escaped') {
            await settleUnknown(lkey, fence, fp, binding, key, result.timeout ? 'timeout' : 'error');
            if (!result.timeout)
                onError(result.err, req);
            restore();
            if (!res.headersSent)
                problem(res, 500, 'outcome_unknown', 'the request failed; its outcome is unknown and must be reconciled');
            if (result.timeout) {
                // Swallow whatever the abandoned handler writes later.
                const sink = res;
                sink.write = () => true;
                sink.end = () => res;
                sink.writeHead = () => res;
                sink.setHeader = () => res;
                sink.appendHeader = () => res;
                sink.removeHeader = () => { };
            }
            return;
        }
        const status = res.statusCode;
        const body = Buffer.concat(chunks);
        const headers = [];
        for (const [n, v] of Object.entries(res.getHeaders())) {
            if (v === undefined)
                continue;
            headers.push([n, Array.isArray(v) ? v.join(', ') : String(v)]);
        }
        const retryable = mw.NOT_COMMITTED_STATUSES.has(status) || res[RETRYABLE] === true;
        if (retryable) {
            await releaseNotCommitted(lkey, fence, fp, binding, key);
        }
        else {
            const { result: stored, responseSha256 } = mw.encodeResponse(status, headers, body, stored_(), maxStoredBody);
            try {
                await retrying(() => client.settle(lkey, fence, fp, binding, { status: status >= 500 ? 'failed' : 'completed', result: stored, responseSha256 }), new Deadline(leaseMs + 1000), 'settle');
            }
            catch (e) {
                // The response goes out anyway (the effect happened); the record
                // becomes unknown when its lease lapses.
                log.error(`idempotency: the response of key ${key} could not be settled`, e);
            }
        }
        restore();
        res.end(body);
    }
    const stored_ = () => stored;
    async function releaseNotCommitted(lkey, fence, fp, binding, key) {
        count('not_committed');
        try {
            await retrying(() => client.release(lkey, fence, 'not_committed'), new Deadline(leaseMs), 'release');
        }
        catch (e) {
            if (e instanceof InvalidRequest) {
                // A server without release(not_committed) (SPEC §4): the safe record is unknown.
                log.warn(`idempotency: the ledger refused release(not_committed) for key ${key}; settling unknown`);
                await settleUnknown(lkey, fence, fp, binding, key, 'not_committed unsupported');
            }
            else {
                log.error(`idempotency: release of key ${key} failed`, e);
            }
        }
    }
    async function settleUnknown(lkey, fence, fp, binding, key, why) {
        count('outcome_unknown');
        log.warn(`idempotency: key ${key} failed (${why}); outcome unknown`);
        try {
            await retrying(() => client.settle(lkey, fence, fp, binding, { status: 'unknown', error: `handler failed: ${why}` }), new Deadline(leaseMs + 1000), 'settle');
        }
        catch (e) {
            log.error(`idempotency: settle unknown of key ${key} failed`, e); // the lease lapses after dispatch: unknown anyway
        }
    }
    function replay(res, key, result) {
        const s = mw.decodeResponse(result);
        if (!s || s.body === null) {
            return refuse(res, 409, 'response_not_stored', 'this request completed but its response was too large to store; it will not run again', key);
        }
        count('replayed');
        log.info(`idempotency: replay of key ${key}`);
        send(res, s.status, [...s.headers, ['idempotent-replayed', 'true']], s.body);
    }
    /** A claim or dispatch that failed (SPEC §8): only a ledger that gave no
     * answer or a 503 `unavailable` lets a failOpen route run the handler; a
     * refusal never does. */
    function ledgerFailed(res, next, policy, key, err, call) {
        const f = mw.classifyLedgerError(err, unavailableRetryAfterS);
        if (policy.failOpen && f.failOpen) {
            count('fail_open');
            log.warn(`idempotency: ledger unreachable (${String(err)}); key ${key} runs WITHOUT idempotency (failOpen)`);
            return next();
        }
        count(f.code);
        if (f.unexpected)
            log.error(`idempotency: unexpected answer of the ledger to the ${call} of key ${key}`, err);
        else
            log.warn(`idempotency: the ${call} of key ${key} failed (${f.code}): ${String(err)}`);
        problem(res, f.status, f.code, f.detail, f.retryAfter === null ? [] : [['retry-after', String(f.retryAfter)]]);
    }
    const middleware = ((req, res, next) => {
        handle(req, res, next).catch((e) => next(e));
    });
    middleware.errorHandler = (err, req, res, next) => {
        const st = req[STATE];
        if (st && st.active) {
            st.fail(err);
            return;
        }
        next(err);
    };
    Object.defineProperty(middleware, 'stats', { value: stats, enumerable: true });
    middleware.wrap = (handler) => (req, res) => {
        const fallback = (err) => {
            if (err !== undefined)
                return middleware.errorHandler(err, req, res, () => {
                    if (!res.headersSent) {
                        res.statusCode = 500;
                        res.end();
                    }
                });
            // next(): run the handler; a throw or rejection is an escaped failure.
            try {
                Promise.resolve(handler(req, res)).catch((e) => fallback(e ?? new Error('rejected')));
            }
            catch (e) {
                fallback(e ?? new Error('thrown undefined'));
            }
        };
        middleware(req, res, fallback);
    };
    return middleware;
}
