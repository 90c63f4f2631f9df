// withIdempotency(handler, { client, ... }): SPEC §8 around a Fetch API
// handler, `(request: Request, ...rest) => Response | Promise<Response>`:
// Next.js route handlers, Hono (`app.fetch`), Bun.serve, Deno.serve, or any
// framework that speaks Request/Response. The same engine (mwcore.ts), the
// same answers and problem codes as the Express middleware.
//
//   export const POST = withIdempotency(async (request) => Response.json(payment, { status: 201 }),
//                                       { client, principal: (request) => accountOf(request) });
//
// The handler gets the request itself (its body unread: the middleware reads
// a clone) and the other arguments as they came (Next.js's `{ params }`,
// Hono's `env`/`ctx`). Its response is read whole (the settle needs the
// bytes) and answered as a new Response with the same status and headers.
import * as mw from './mwcore.js';
export { fixedPrincipal, authenticatedPrincipal, markRetryable } from './mwcore.js';
/** Statuses whose responses have no body (the Response constructor refuses one). */
const NULL_BODY = new Set([101, 103, 204, 205, 304]);
function toResponse(r) {
    const headers = new Headers();
    for (const [n, v] of r.headers)
        headers.append(n, v);
    return new Response(NULL_BODY.has(r.status) ? null : r.body, { status: r.status, headers });
}
/** The body's bytes, from a clone (the handler reads the request itself); 'too_large' past max. */
async function readBody(request, max) {
    if (request.body === null)
        return new Uint8Array(0);
    const reader = request.clone().body.getReader();
    const parts = [];
    let size = 0;
    for (;;) {
        const { done, value } = await reader.read();
        if (done)
            break;
        size += value.byteLength;
        if (size > max) {
            await reader.cancel();
            return 'too_large';
        }
        parts.push(value);
    }
    return Buffer.concat(parts);
}
/** `handler` behind the SPEC §8 middleware. A throw or rejection of the
 * handler (or a value that is not a Response) is an escaped failure: 500
 * `outcome_unknown`, the record `unknown`. */
export function withIdempotency(handler, options) {
    if (typeof handler !== 'function')
        throw new TypeError('withIdempotency(handler, options): handler must be a function');
    const engine = mw.createEngine(options, 'withIdempotency');
    const wrapped = async (request, ...rest) => {
        const url = new URL(request.url);
        const begun = await engine.begin({
            req: request,
            method: request.method,
            path: url.pathname,
            target: url.pathname + url.search, // "/p?" and "/p" are one target (URL drops a lone "?")
            headerValues: (name) => {
                const v = request.headers.get(name); // several field lines arrive joined with ", "
                return v === null ? [] : [v];
            },
            headerEntries: () => {
                const out = [];
                request.headers.forEach((v, n) => out.push([n, v]));
                return out;
            },
            body: (max) => readBody(request, max),
        });
        if (begun.kind === 'unwrapped')
            return handler(request, ...rest);
        if (begun.kind === 'answer')
            return toResponse(begun.response);
        const run = begun.run;
        let timer;
        const handled = (async () => {
            const response = await handler(request, ...rest);
            if (!(response instanceof Response))
                throw new TypeError(`the handler must return a Response, not ${String(response)}`);
            return { ok: true, response };
        })().catch((err) => ({ ok: false, err, timeout: false }));
        const racers = [handled];
        if (run.timeoutMs != null) {
            const ms = run.timeoutMs;
            racers.push(new Promise((resolve) => (timer = setTimeout(() => resolve({ ok: false, err: new Error(`handler timed out after ${ms} ms`), timeout: true }), ms))));
        }
        let result = await Promise.race(racers);
        if (timer)
            clearTimeout(timer);
        let body = null;
        if (result.ok) {
            try {
                body = new Uint8Array(await result.response.arrayBuffer());
            }
            catch (err) {
                result = { ok: false, err, timeout: false }; // the body stream failed: an escaped failure
            }
        }
        if (!result.ok || body === null) {
            const failed = result;
            return toResponse(await run.fail(failed.err, failed.timeout));
        }
        const response = result.response;
        const headers = [];
        response.headers.forEach((v, n) => headers.push([n, v]));
        await run.respond(response.status, headers, body, mw.isMarkedRetryable(response));
        return new Response(NULL_BODY.has(response.status) ? null : body, {
            status: response.status,
            statusText: response.statusText,
            headers: response.headers,
        });
    };
    Object.defineProperty(wrapped, 'stats', { value: engine.stats, enumerable: true });
    return wrapped;
}
