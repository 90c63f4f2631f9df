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
const node_stream_1 = require("node:stream");
const mw = __importStar(require("./mwcore.js"));
var mwcore_js_1 = require("./mwcore.js");
Object.defineProperty(exports, "fixedPrincipal", { enumerable: true, get: function () { return mwcore_js_1.fixedPrincipal; } });
Object.defineProperty(exports, "authenticatedPrincipal", { enumerable: true, get: function () { return mwcore_js_1.authenticatedPrincipal; } });
Object.defineProperty(exports, "markRetryable", { enumerable: true, get: function () { return mwcore_js_1.markRetryable; } });
async function payloadBytes(payload) {
    if (payload === null || payload === undefined)
        return Buffer.alloc(0);
    if (Buffer.isBuffer(payload))
        return payload;
    if (typeof payload === 'string')
        return Buffer.from(payload, 'utf8');
    if (payload instanceof Uint8Array)
        return Buffer.from(payload);
    if (payload instanceof node_stream_1.Readable || (typeof payload === 'object' && typeof payload.pipe === 'function')) {
        const parts = [];
        for await (const c of payload)
            parts.push(typeof c === 'string' ? Buffer.from(c) : Buffer.from(c));
        return Buffer.concat(parts);
    }
    return Buffer.from(String(payload), 'utf8');
}
/** Headers of the reply as [name, value] pairs (lower-case names). */
function replyHeaders(reply) {
    const out = [];
    for (const [n, v] of Object.entries(reply.getHeaders())) {
        if (v === undefined)
            continue;
        out.push([n.toLowerCase(), Array.isArray(v) ? v.join(', ') : String(v)]);
    }
    return out;
}
/** The Fastify plugin of the SPEC §8 middleware. */
function idempotency(options) {
    const engine = mw.createEngine(options, 'idempotency');
    const states = new WeakMap();
    function stateOf(request) {
        let st = states.get(request);
        if (!st) {
            st = { parts: [], size: 0, ended: false, run: null, over: false, sending: false, escaped: null, timer: undefined, timedOut: null };
            states.set(request, st);
        }
        return st;
    }
    /** Replace the reply's answer: status, content headers and body. */
    function setAnswer(reply, r) {
        reply.removeHeader('content-type');
        reply.removeHeader('content-length');
        reply.code(r.status);
        for (const [n, v] of r.headers)
            reply.header(n, v);
        return r.body;
    }
    /** The body as the parser read it (or empty, for a request that has none). */
    function bodyOf(request, st, max) {
        if (!st || (!st.ended && st.size === 0 && !hasBody(request.raw)))
            return Buffer.alloc(0);
        if (st.size > max)
            return 'too_large';
        if (!st.ended) {
            throw new Error('idempotency: the request body was not read before the handler (the fingerprint needs it): ' +
                'a route behind the idempotency plugin needs a content-type parser that reads the whole body');
        }
        return Buffer.concat(st.parts);
    }
    const plugin = async function settleIdempotency(instance) {
        instance.addHook('preParsing', async (request, _reply, payload) => {
            if (request.headers['idempotency-key'] === undefined)
                return payload;
            const st = stateOf(request);
            let received = 0;
            const tee = new node_stream_1.Transform({
                transform(chunk, _enc, cb) {
                    received += chunk.length;
                    tee.receivedEncodedLength = received;
                    st.size += chunk.length;
                    if (st.size <= engine.maxRequestBody)
                        st.parts.push(chunk);
                    cb(null, chunk);
                },
                flush(cb) {
                    st.ended = true;
                    cb();
                },
            });
            payload.on('error', (e) => tee.destroy(e));
            return payload.pipe(tee);
        });
        instance.addHook('preHandler', async (request, reply) => {
            const st = states.get(request);
            const { path, target } = mw.pathAndTarget(request.url);
            const begun = await engine.begin({
                req: request,
                method: request.method,
                path,
                target,
                headerValues: (name) => mw.rawHeaderValues(request.raw, name),
                headerEntries: () => mw.rawHeaderEntries(request.raw),
                body: async (max) => bodyOf(request, st, max),
            });
            if (begun.kind === 'unwrapped')
                return;
            if (begun.kind === 'answer') {
                const body = setAnswer(reply, begun.response);
                return reply.send(body);
            }
            const run = begun.run;
            const s = stateOf(request);
            s.run = run;
            if (run.timeoutMs != null) {
                const ms = run.timeoutMs;
                s.timer = setTimeout(() => {
                    if (s.over)
                        return;
                    s.over = true;
                    s.timedOut = run.fail(new Error(`handler timed out after ${ms} ms`), true);
                    void s.timedOut.then((problem) => {
                        if (!s.sending && !reply.sent)
                            reply.send(setAnswer(reply, problem));
                    });
                }, ms);
            }
        });
        instance.addHook('onError', async (request, _reply, error) => {
            const st = states.get(request);
            if (st?.run && !st.over && !st.escaped)
                st.escaped = { err: error };
        });
        instance.addHook('onSend', async (request, reply, payload) => {
            const st = states.get(request);
            if (!st?.run)
                return payload;
            st.sending = true;
            if (st.timedOut)
                return setAnswer(reply, await st.timedOut);
            if (st.over)
                return payload;
            st.over = true;
            if (st.timer)
                clearTimeout(st.timer);
            if (st.escaped)
                return setAnswer(reply, await st.run.fail(st.escaped.err, false));
            let body;
            try {
                body = await payloadBytes(payload);
            }
            catch (err) {
                // The response body (a stream) failed before it ended: an escaped failure.
                return setAnswer(reply, await st.run.fail(err, false));
            }
            await st.run.respond(reply.statusCode, replyHeaders(reply), body, mw.isMarkedRetryable(reply, reply.raw));
            return body;
        });
        instance.addHook('onResponse', async (request) => {
            const st = states.get(request);
            if (!st?.run || st.over)
                return;
            // The response left without onSend (the handler hijacked the reply):
            // what it answered is unknown to the middleware.
            st.over = true;
            if (st.timer)
                clearTimeout(st.timer);
            await st.run.fail(new Error('the response was sent without the onSend hook (reply.hijack())'), false);
        });
    };
    plugin[Symbol.for('skip-override')] = true;
    plugin[Symbol.for('fastify.display-name')] = 'settle-idempotency';
    Object.defineProperty(plugin, 'stats', { value: engine.stats, enumerable: true });
    return plugin;
}
function hasBody(raw) {
    const te = raw.headers['transfer-encoding'];
    const cl = raw.headers['content-length'];
    return te !== undefined || (cl !== undefined && cl !== '0');
}
