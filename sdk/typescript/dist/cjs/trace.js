"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.injectTraceContext = injectTraceContext;
// The caller's W3C trace context on every request to settle (SPEC §12,
// Traces), without a dependency on OpenTelemetry: `@opentelemetry/api` is an
// optional peer dependency, loaded once, on the first request (require() in
// the CommonJS build, import() in the ES module one). When it is installed,
// the headers its global propagator writes for the active context are added
// (with the W3C propagator that the OpenTelemetry SDKs register: `traceparent`,
// and `tracestate` when the context has one); when it is not, or no span is
// active, or no propagator is registered, nothing is.
const node_module_1 = require("node:module");
const node_path_1 = require("node:path");
let api; // undefined: not loaded yet
let loading;
function usable(m) {
    const a = m;
    return typeof a?.context?.active === 'function' && typeof a?.propagation?.inject === 'function' ? a : null;
}
function load() {
    loading ??= (async () => {
        const name = '@opentelemetry/api'; // a variable: an optional peer dependency, not bundled
        let m = null;
        try {
            // `require` exists in the CommonJS build only: the application's own
            // CommonJS copy of the API there, import() in the ES module build.
            m = typeof require === 'function' ? require(name) : await import(name);
        }
        catch {
            // `npm install ./sdk/typescript` links the folder, and Node resolves
            // from this file's real path, outside the application: look from the
            // application (the working directory) as well.
            try {
                m = (0, node_module_1.createRequire)((0, node_path_1.join)(process.cwd(), 'package.json'))(name);
            }
            catch {
                m = null; // not installed (or failing to load): no trace headers
            }
        }
        api = usable(m) ?? usable(m?.default);
    })();
    return loading;
}
function inject(headers) {
    if (!api)
        return;
    try {
        api.propagation.inject(api.context.active(), headers);
    }
    catch {
        // a failing propagator never fails a call to the ledger
    }
}
/** Adds the trace context headers of the active context to `headers`: at
 * once when the API is loaded (or known absent), else once it is. */
function injectTraceContext(headers) {
    if (api === undefined)
        return load().then(() => inject(headers));
    inject(headers);
}
