"use strict";
var __createBinding = (this && this.__createBinding) || (Object.create ? (function(o, m, k, k2) {
    if (k2 === undefined) k2 = k;
    var desc = Object.getOwnPropertyDescriptor(m, k);
    if (!desc || ("get" in desc ? !m.__esModule : desc.writable || desc.configurable)) {
      desc = { enumerable: true, get: function() { return m[k]; } };
    }
    Object.defineProperty(o, k2, desc);
}) : (function(o, m, k, k2) {
    if (k2 === undefined) k2 = k;
    o[k2] = m[k];
}));
var __setModuleDefault = (this && this.__setModuleDefault) || (Object.create ? (function(o, v) {
    Object.defineProperty(o, "default", { enumerable: true, value: v });
}) : function(o, v) {
    o["default"] = v;
});
var __importStar = (this && this.__importStar) || (function () {
    var ownKeys = function(o) {
        ownKeys = Object.getOwnPropertyNames || function (o) {
            var ar = [];
            for (var k in o) if (Object.prototype.hasOwnProperty.call(o, k)) ar[ar.length] = k;
            return ar;
        };
        return ownKeys(o);
    };
    return function (mod) {
        if (mod && mod.__esModule) return mod;
        var result = {};
        if (mod != null) for (var k = ownKeys(mod), i = 0; i < k.length; i++) if (k[i] !== "default") __createBinding(result, mod, k[i]);
        __setModuleDefault(result, mod);
        return result;
    };
})();
Object.defineProperty(exports, "__esModule", { value: true });
exports.markRetryable = exports.authenticatedPrincipal = exports.fixedPrincipal = void 0;
exports.idempotency = idempotency;
const mw = __importStar(require("./mwcore.js"));
var mwcore_js_1 = require("./mwcore.js");
Object.defineProperty(exports, "fixedPrincipal", { enumerable: true, get: function () { return mwcore_js_1.fixedPrincipal; } });
Object.defineProperty(exports, "authenticatedPrincipal", { enumerable: true, get: function () { return mwcore_js_1.authenticatedPrincipal; } });
Object.defineProperty(exports, "markRetryable", { enumerable: true, get: function () { return mwcore_js_1.markRetryable; } });
const STATE = Symbol.for('settle.idempotency');
function idempotency(options) {
    const engine = mw.createEngine(options, 'idempotency');
    function send(res, r) {
        for (const n of res.getHeaderNames())
            res.removeHeader(n);
        res.statusCode = r.status;
        for (const [n, v] of r.headers)
            res.setHeader(n, v);
        res.end(r.body);
    }
    /** The whole request body (the fingerprint needs it), put back into the
     * request stream once read: the handler and any body parser after the
     * middleware read the request exactly as without it. */
    async function readBody(req, maxRequestBody) {
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
        const { path, target } = mw.pathAndTarget(req.originalUrl ?? req.url ?? '/');
        const begun = await engine.begin({
            req,
            method: req.method ?? 'GET',
            path,
            target,
            headerValues: (name) => mw.rawHeaderValues(req, name),
            headerEntries: () => mw.rawHeaderEntries(req),
            body: (max) => readBody(req, max),
        });
        if (begun.kind === 'unwrapped')
            return next();
        if (begun.kind === 'answer')
            return send(res, begun.response);
        await execute(req, res, next, begun.run);
    }
    /** Runs the rest of the chain (next()) with the response captured: nothing
     * reaches the client until the outcome is settled. */
    async function execute(req, res, next, run) {
        const chunks = [];
        const orig = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders, destroy: res.destroy };
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
        // A response destroyed before it ended (stream.pipeline() of a body
        // stream that errored, whatever its size): an escaped failure, answered
        // 500 outcome_unknown if the connection can still take it.
        r.destroy = function (err) {
            if (!over) {
                finish({ kind: 'escaped', err: err ?? new Error('the response was destroyed before it ended'), timeout: false });
                return res;
            }
            return orig.destroy.call(res, err);
        };
        let timer;
        if (run.timeoutMs != null) {
            const ms = run.timeoutMs;
            timer = setTimeout(() => finish({ kind: 'escaped', err: new Error(`handler timed out after ${ms} ms`), timeout: true }), ms);
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
        const restore = () => {
            // Later writes of an abandoned handler go nowhere; ours use the originals.
            res.writeHead = orig.writeHead;
            res.write = orig.write;
            res.end = orig.end;
            res.flushHeaders = orig.flushHeaders;
            res.destroy = orig.destroy;
        };
        if (result.kind === 'escaped') {
            const problem = await run.fail(result.err, result.timeout);
            restore();
            if (!res.headersSent)
                send(res, problem);
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
        const body = Buffer.concat(chunks);
        const headers = [];
        for (const [n, v] of Object.entries(res.getHeaders())) {
            if (v === undefined)
                continue;
            headers.push([n, Array.isArray(v) ? v.join(', ') : String(v)]);
        }
        await run.respond(res.statusCode, headers, body, mw.isMarkedRetryable(res));
        restore();
        res.end(body);
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
    Object.defineProperty(middleware, 'stats', { value: engine.stats, enumerable: true });
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
